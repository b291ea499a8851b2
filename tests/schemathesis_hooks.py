"""Schemathesis hooks for tests/integration/test_openapi.py (SCHEMATHESIS_HOOKS names this
module): how to send an NDJSON body, which the spec describes as an array of items."""

from __future__ import annotations

import json
from typing import Any

import schemathesis


@schemathesis.serializer("application/x-ndjson")
def ndjson(ctx: Any, value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, list):
        return "".join(json.dumps(item) + "\n" for item in value).encode()
    return json.dumps(value).encode()
