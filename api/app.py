"""The FastAPI application: `create_app()` builds it with its runtime (uvicorn's factory).

Also here: the OpenAPI document made true (the error shape for every error status, the
bearer scheme, the JSON and NDJSON submission bodies), `/docs` served from assets shipped in
the package (api/static: no page loads anything from another site), a 405 whose `Allow`
lists every method of the path, and a few response headers that keep browsers careful.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

from celery import Celery
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api import errors, guards, label_pages, metrics, pages, schemas
from api import label_routes as labels
from api.body import SpoolBudget
from api.routes import JSON_QUERY_PARAMETERS, router
from api.streams import StreamSlots
from recallq.coordination.submissions import SubmissionLimiter
from recallq.core.redact import install_log_redaction, redact_url
from recallq.execution import celery_queue as broker
from recallq.execution.runtime import Runtime
from recallq.settings import read_settings
from recallq.state.apikeys import KeyStore

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"
SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
]


def create_app(runtime: Runtime | None = None) -> FastAPI:
    if runtime is None:
        settings = read_settings()  # the API process's one read of its environment
        sender = broker.configure(Celery("recallq-api"), settings.redis_url)
        queue = broker.CeleryQueue(sender, settings.extraction_pack)
        runtime = Runtime.distributed(settings, queue)
    settings = runtime.settings
    install_log_redaction(runtime.redactor)
    app = FastAPI(
        title="recallq",
        version="0.1.0",
        description="Context-recall scoring for RAG evaluation, as a service.",
        docs_url=None,
        redoc_url=None,
    )
    app.state.runtime = runtime
    app.state.keys = KeyStore(runtime.database)
    app.state.spool_budget = SpoolBudget(settings.max_spool_bytes)
    app.state.result_streams = StreamSlots(settings.max_result_streams_per_key)
    if runtime.redis is not None:
        app.state.submissions = SubmissionLimiter(
            runtime.redis, settings.submissions_per_minute, settings.submission_burst
        )
    hosts = guards.allowed_hosts(settings.allowed_hosts)
    if settings.auth == "off":
        log.warning(
            "RECALLQ_AUTH=off: every request acts in project 'default' with every role, "
            "without a key. Anyone who can reach this API can read, submit and delete runs. "
            "Only these Host names are answered (DNS rebinding): %s and the address it "
            "listens on (RECALLQ_ALLOWED_HOSTS adds more); a request body must be JSON or "
            "NDJSON, which a page on another site cannot send.",
            ", ".join(sorted(hosts)),
        )
    elif not settings.session_secret:
        log.warning(
            "RECALLQ_SESSION_SECRET is not set: web page sessions are signed with the keys' "
            "stored hashes alone, so a copy of the api_keys table could forge one. Set it to a "
            "long random string, the same for every API process."
        )
    log.info("database %s", redact_url(settings.database_url))
    errors.install(app, runtime.database.ping)
    _allow_header_on_405(app)
    app.include_router(router)
    app.include_router(labels.router)
    pages.install(app)
    app.include_router(label_pages.router)
    metrics.install(app, runtime)
    _docs(app)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    app.add_middleware(guards.RequestGuards, auth_off=settings.auth == "off", hosts=hosts)
    app.add_middleware(_SecurityHeaders)
    return app


class _SecurityHeaders:
    """nosniff, no framing, no referrer: the API serves JSON, CSV and one docs page."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


#: the routers the app includes (FastAPI keeps each as one object of its own among the app's
#: routes: the 405 handler looks at their routes directly)
INCLUDED_ROUTERS = (router, labels.router, pages.router, label_pages.router)


def _allow_header_on_405(app: FastAPI) -> None:
    """Starlette's 405 names only the methods of the first route that matched the path; the
    answer should name every method the path has."""
    plain = app.exception_handlers[StarletteHTTPException]
    included = [route for included in INCLUDED_ROUTERS for route in included.routes]

    async def handler(request: Request, exc: Exception) -> Any:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 405:
            methods: set[str] = set()
            for route in [*request.app.router.routes, *included]:
                match, _ = route.matches(request.scope)
                if match != Match.NONE:
                    methods.update(getattr(route, "methods", None) or ())
            if methods:
                exc.headers = {**(exc.headers or {}), "Allow": ", ".join(sorted(methods))}
        response = plain(request, exc)
        return await response if inspect.isawaitable(response) else response

    app.add_exception_handler(StarletteHTTPException, handler)


def _docs(app: FastAPI) -> None:
    app.mount("/docs/static", StaticFiles(directory=STATIC), name="docs-static")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="recallq API",
            swagger_js_url="/docs/static/swagger-ui-bundle.js",
            swagger_css_url="/docs/static/swagger-ui.css",
            swagger_favicon_url="/docs/static/favicon-32x32.png",
            # no call to the public validator service either
            swagger_ui_parameters={"validatorUrl": None},
        )


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, with every error response in recallq's error shape and the
    submission body's JSON schema among the components."""
    if app.openapi_schema:
        return app.openapi_schema
    spec = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    components = spec.setdefault("components", {}).setdefault("schemas", {})
    submission = schemas.RunSubmission.model_json_schema(
        ref_template="#/components/schemas/{model}"
    )
    components.update(submission.pop("$defs", {}))
    components["RunSubmission"] = submission
    components.setdefault("ErrorResponse", schemas.ErrorResponse.model_json_schema())
    components["ResumeRequest"] = schemas.ResumeRequest.model_json_schema()
    error_ref = {"$ref": "#/components/schemas/ErrorResponse"}
    for path in spec.get("paths", {}).values():
        for operation in path.values():
            responses = operation.setdefault("responses", {})
            for status, response in responses.items():
                if status.startswith("4"):
                    response["content"] = {"application/json": {"schema": error_ref}}
            # any request may find the database out (errors.DatabaseOutage)
            if "503" not in responses:
                responses["503"] = {
                    "description": "The database cannot be reached now; retry after Retry-After",
                    "content": {"application/json": {"schema": error_ref}},
                }
            # any request may be one the HTTP server itself cannot parse (a NUL in a header,
            # a head too long): it answers 400 in plain text before recallq sees it
            responses.setdefault("400", {"description": "Malformed request"})
            responses["400"]["content"] = {
                "application/json": {"schema": error_ref},
                "text/plain": {"schema": {"type": "string"}},
            }
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    for parameter in spec["paths"]["/v1/runs"]["post"]["parameters"]:
        if parameter["name"] in JSON_QUERY_PARAMETERS:  # JSON text: the run field's schema
            del parameter["schema"]
            field = submission["properties"][parameter["name"]]
            parameter["content"] = {"application/json": {"schema": field}}
    app.openapi_schema = spec
    return spec
