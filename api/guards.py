"""What a web page on another site can make a browser send, refused before any route runs.

- A body sent to /v1 must say it is JSON, NDJSON or CSV (415 otherwise), with keys required or
  not. A page on another origin can send, without asking the API first (a CORS preflight,
  which this API never grants), only a body typed text/plain, form-urlencoded or multipart,
  or one with no Content-Type at all (a `no-cors` fetch of a Blob): none of those is
  accepted, so such a page cannot submit a run. One rule for both modes: clients that send
  bodies already type them.
- With `RECALLQ_AUTH=off` only allowed Host names are answered (421 otherwise): localhost,
  the address the connection came in on, and `RECALLQ_ALLOWED_HOSTS`, each exactly, with an
  optional port (`localhost:8094@evil.com` is no localhost). A name of the attacker's that
  resolves to this machine (DNS rebinding) would otherwise make the API the attacker's page's
  own origin, free to read and write everything. With keys required that page has no key and
  no session cookie of this origin, so any Host is answered.
"""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Receive, Scope, Send

from api.errors import error_response

BODY_TYPES = frozenset({"application/json", "application/x-ndjson", "text/csv"})
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


# what a Host header may be: a name or an IPv4 address, or an IPv6 address in brackets, and
# an optional port; nothing else (no user part, no second name, no path, no space)
_HOST = re.compile(r"(?P<name>[a-z0-9.-]+|\[(?P<ipv6>[0-9a-f:.]+)\])(?::[0-9]{1,5})?")


def host_name(host: str) -> str | None:
    """The name of a Host header, lower-case, without its port and an IPv6 address's brackets
    ("[::1]:80" -> "::1"); None when the header is anything but exactly a name or address with
    an optional port ("localhost:8094@evil.com", "localhost:8094 evil.com")."""
    match = _HOST.fullmatch(host.lower())
    if match is None:
        return None
    return match["ipv6"] or match["name"]


def allowed_hosts(configured: str) -> frozenset[str]:
    """Host names answered with auth off: localhost and the comma-separated `configured`
    (each a name or address, with or without a port)."""
    names = {host_name(name.strip()) for name in configured.split(",") if name.strip()}
    return LOCAL_HOSTS | {name for name in names if name is not None}


class RequestGuards:
    """The two rules of the module docstring, as ASGI middleware (nothing is read or parsed
    before they are checked)."""

    def __init__(self, app: ASGIApp, auth_off: bool, hosts: frozenset[str]) -> None:
        self.app = app
        self.auth_off = auth_off
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {name.lower(): value for name, value in scope.get("headers", [])}
        has_body = headers.get(b"content-length", b"0") != b"0" or b"transfer-encoding" in headers
        if self.auth_off and not self._host_allowed(scope, headers.get(b"host")):
            response = error_response(
                421,
                "misdirected_request",
                "this API answers only its own host names (RECALLQ_ALLOWED_HOSTS)",
                {"Connection": "close"} if has_body else None,
            )
            await response(scope, receive, send)
            return
        if (
            has_body
            and scope["method"] in BODY_METHODS
            and scope["path"].startswith("/v1/")
            and _media_type(headers.get(b"content-type", b"")) not in BODY_TYPES
        ):
            response = error_response(
                415,
                "unsupported_media_type",
                "a body must be application/json or application/x-ndjson (text/csv where a "
                "route takes CSV); say which in Content-Type",
                {"Connection": "close"},
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _host_allowed(self, scope: Scope, host: bytes | None) -> bool:
        if not host:
            return False
        name = host_name(host.decode("latin-1"))
        if name is None:
            return False
        server = scope.get("server")
        return name in self.hosts or (server is not None and name == str(server[0]).lower())


def _media_type(content_type: bytes) -> str:
    return content_type.decode("latin-1").split(";", 1)[0].strip().lower()
