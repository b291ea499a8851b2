"""The FastAPI application: `create_app()` builds it with its runtime (uvicorn's factory)."""

from __future__ import annotations

from celery import Celery
from fastapi import FastAPI

from api import errors
from api.routes import router
from recallq import broker
from recallq.runtime import Runtime
from recallq.settings import Settings


def create_app(runtime: Runtime | None = None) -> FastAPI:
    if runtime is None:
        settings = Settings()
        sender = broker.configure(Celery("recallq-api"), settings.redis_url)
        queue = broker.CeleryQueue(sender, settings.extraction_pack)
        runtime = Runtime.distributed(settings, queue)
    app = FastAPI(title="recallq", version="0.1.0")
    app.state.runtime = runtime
    errors.install(app)
    app.include_router(router)
    return app
