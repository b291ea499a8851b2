"""Which project a request acts in. Bearer keys scoped to projects plug in here."""

from __future__ import annotations

DEFAULT_PROJECT = "default"


def current_project() -> str:
    return DEFAULT_PROJECT
