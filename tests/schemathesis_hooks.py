"""Schemathesis hooks for tests/integration/test_openapi.py (SCHEMATHESIS_HOOKS names this
module): how to send an NDJSON body, which the spec describes as an array of items.

Also: no targeted search. Schemathesis asks Hypothesis to steer generation towards inputs an
operation accepts (`hypothesis.target`), and Hypothesis's optimiser for that steering crashed
with an IndexError inside Hypothesis 6.170 during a long fuzzing run (a crash of the tool,
reported as an error of the run, not a response of the API). Plain random generation keeps
every check and finds what this API can get wrong, so targeting is turned off here.
"""

from __future__ import annotations

import json
from typing import Any

import hypothesis
import schemathesis


def _no_target(observation: float, *, label: str = "") -> float:
    return observation


hypothesis.target = _no_target  # schemathesis calls hypothesis.target(...) by attribute


@schemathesis.serializer("application/x-ndjson")
def ndjson(ctx: Any, value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, list):
        return "".join(json.dumps(item) + "\n" for item in value).encode()
    return json.dumps(value).encode()
