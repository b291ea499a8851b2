"""The FastAPI application."""

from __future__ import annotations

from fastapi import FastAPI

from api import errors
from api.routes import router


def create_app() -> FastAPI:
    app = FastAPI(title="recallq", version="0.1.0")
    errors.install(app)
    app.include_router(router)
    return app


app = create_app()
