"""Who a request is and which project it acts in: `Authorization: Bearer KEY`.

Every /v1 route depends on one of `Project` (read), `WriteProject`, `AdminProject` (or the
principal versions): a missing, unknown or revoked key is a 401 `unauthenticated`; a key
whose role does not allow the route is a 403 `forbidden`. Routes then look runs up within
the key's project only, so another project's run is a 404, exactly like a missing one.

With RECALLQ_AUTH=off (a developer's laptop) every request acts in the project "default"
with every role; the API says so with a warning when it starts.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.errors import HttpError
from recallq.execution.runtime import Runtime
from recallq.state.apikeys import DEFAULT_PROJECT, KeyStore, Principal

DEFAULT_PRINCIPAL = Principal(None, DEFAULT_PROJECT, "admin")
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="recallq"'}

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="An API key made with `recallq keys create --project NAME --role ROLE`.",
)


def _unauthenticated(message: str) -> HttpError:
    return HttpError(401, "unauthenticated", message, CHALLENGE)


def current_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    runtime: Runtime = request.app.state.runtime
    if runtime.settings.auth == "off":
        return DEFAULT_PRINCIPAL
    if credentials is None:
        raise _unauthenticated(
            "no API key: the recallq CLI and recallq.Client send RECALLQ_API_KEY; other "
            "clients send `Authorization: Bearer KEY` (recallq keys create makes one)"
        )
    keys: KeyStore = request.app.state.keys
    principal = keys.authenticate(credentials.credentials)
    if principal is None:
        raise _unauthenticated("the API key is unknown or revoked")
    return principal


Caller = Annotated[Principal, Depends(current_principal)]


def _require(principal: Principal, role: str) -> Principal:
    if not principal.may(role):
        raise HttpError(
            403, "forbidden", f"this key's role ({principal.role}) may not do this; it needs {role}"
        )
    return principal


def reader(principal: Caller) -> Principal:
    return principal


def writer(principal: Caller) -> Principal:
    return _require(principal, "write")


def admin(principal: Caller) -> Principal:
    return _require(principal, "admin")


def current_project(principal: Caller) -> str:
    """The project a read acts in (every role may read its own project)."""
    return principal.project


def write_project(principal: Annotated[Principal, Depends(writer)]) -> str:
    return principal.project


def admin_project(principal: Annotated[Principal, Depends(admin)]) -> str:
    return principal.project


Project = Annotated[str, Depends(current_project)]
WriteProject = Annotated[str, Depends(write_project)]
AdminProject = Annotated[str, Depends(admin_project)]
Writer = Annotated[Principal, Depends(writer)]
