"""GET /metrics: this API process's Prometheus metrics, and the timing of every request.

Who may read it is its own setting, apart from the API keys (an operator's scraper is not a
project): with RECALLQ_METRICS_TOKEN set, a client sending `Authorization: Bearer TOKEN`;
unset, clients on this host only (loopback; uvicorn takes the client from X-Forwarded-For only
when a proxy on this host sends it, so a local proxy does not open it to everyone). The page
carries counts and timings by model, stage, outcome and route template: never a key, a prompt,
an item's text or an id (recallq.observability.metrics).
"""

from __future__ import annotations

import hmac
import ipaddress
import time
from functools import partial

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import HttpError
from recallq.execution import work
from recallq.execution.runtime import Runtime
from recallq.observability import gauges as metrics_state
from recallq.observability import metrics

# a method a client invents is one series more: anything else is "other"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def install(app: FastAPI, runtime: Runtime) -> None:
    """The route, the request timing, and the state this process reports when scraped."""
    models = runtime.models.keys
    collectors: list[Collector] = [
        metrics_state.WorkCollector(
            partial(work.read_work, runtime.database),
            models,
            None if runtime.heartbeat is None else runtime.heartbeat.live_workers,
        )
    ]
    if runtime.redis is not None:  # the breakers' state is shared in Redis
        collectors.append(metrics_state.BreakerCollector(runtime.breaker, models))
    metrics.use_state_collectors(*collectors)
    token = runtime.settings.metrics_token
    app.add_middleware(_RequestMetrics)

    @app.get(
        "/metrics",
        response_class=Response,
        responses={
            200: {"content": {"text/plain": {}}, "description": "Prometheus text format"},
            401: {"description": "RECALLQ_METRICS_TOKEN is set and was not sent"},
            403: {"description": "No metrics token is set and the client is not on this host"},
        },
    )
    def read_metrics(request: Request) -> Response:
        """Prometheus metrics of this API process (docs/operations.md lists them). Sync on
        purpose: the work-waiting gauges read the database, in the thread pool."""
        _check_access(request, token)
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)


def _check_access(request: Request, token: str | None) -> None:
    if token is None:
        if not _on_this_host(request):
            raise HttpError(
                403,
                "forbidden",
                "/metrics is served to this host only; set RECALLQ_METRICS_TOKEN to let a "
                "scraper elsewhere read it",
            )
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        given.strip().encode("utf-8", "surrogateescape"), token.encode()
    ):
        raise HttpError(
            401,
            "unauthenticated",
            "/metrics needs Authorization: Bearer with the metrics token",
            headers={"WWW-Authenticate": "Bearer"},
        )


def _on_this_host(request: Request) -> bool:
    try:
        return request.client is not None and ipaddress.ip_address(request.client.host).is_loopback
    except ValueError:  # not an address (an ASGI server may give a name or a socket path)
        return False


class _RequestMetrics:
    """Each request's time until its response ended, by method, route template (never the
    path itself, which carries ids) and status code."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client sees when the app raises before answering

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            method = scope["method"] if scope["method"] in METHODS else "other"
            metrics.HTTP_REQUEST_SECONDS.labels(method, route, str(status)).observe(
                time.perf_counter() - started
            )
