"""Every bad input the security review found is a 4xx in the error shape, the API stays
healthy, and its log holds no traceback and none of the input.

Against a real API (keys required), Postgres and Redis: each case was a 500 before.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.secured import bearer, error_of, items, make_key, secured_env, submit
from tests.services import Process, start_api

JSON = {"content-type": "application/json"}
NDJSON = {"content-type": "application/x-ndjson"}
MARK = "BODY-MARKER-7f3a"  # in bad bodies: must never reach the log


@pytest.fixture(scope="module")
def env(service_env: dict[str, str]) -> dict[str, str]:
    return secured_env(service_env, submissions_per_minute=0, max_active_runs_per_project=1000)


@pytest.fixture(scope="module")
def served(env: dict[str, str]) -> Iterator[tuple[str, str, Process]]:
    key = make_key(env, "bad-input", "admin")
    process, url = start_api(env)
    yield url, key, process
    process.stop()


@pytest.fixture(scope="module")
def api(served: tuple[str, str, Process]) -> str:
    return served[0]


@pytest.fixture(scope="module")
def key(served: tuple[str, str, Process]) -> str:
    return served[1]


def _raw(
    api: str, key: str, body: bytes, headers: dict[str, str] = JSON, **params: Any
) -> httpx.Response:
    return httpx.post(
        f"{api}/v1/runs",
        content=body,
        headers={**bearer(key), **headers},
        params=params,
        timeout=60,
    )


def _item(**fields: Any) -> dict[str, Any]:
    return {"id": "a", "ground_truth": f"{MARK} fact.", "context": ["fact"], **fields}


def _body(**run: Any) -> bytes:
    return json.dumps({"items": [_item()], **run}).encode()


DEEP = b'{"items": [{"id": "a", "context": ["x"], "input": ' + b"[" * 1000 + b"]" * 1000 + b"}]}"
BOMB = " | ".join(["[" + ",".join(["@"] * 10) + "]"] * 12)  # 10^12 copies of the item, 285 bytes
CASES: list[tuple[str, bytes, dict[str, str], dict[str, Any], tuple[int, str]]] = [
    ("JSON nested 1,000 deep", DEEP, JSON, {}, (400, "invalid_json")),
    (
        "NaN",
        _body(scale=1).replace(b'"scale": 1', b'"scale": NaN'),
        JSON,
        {},
        (400, "invalid_json"),
    ),
    (
        "Infinity in an item",
        json.dumps({"items": [_item()]}).encode().replace(b'"a"', b'"a", "input": Infinity', 1),
        JSON,
        {},
        (400, "invalid_json"),
    ),
    (
        "1e400",
        _body(scale=1).replace(b'"scale": 1', b'"scale": 1e400'),
        JSON,
        {},
        (400, "invalid_json"),
    ),
    (
        "NUL in an id",
        json.dumps({"items": [_item(id="a\x00b")]}).encode(),
        JSON,
        {},
        (400, "invalid_json"),
    ),
    ("NUL in a name", _body(name="run\x00"), JSON, {}, (400, "invalid_json")),
    (
        "NUL in a ground truth",
        json.dumps({"items": [_item(ground_truth="x\x00y")]}).encode(),
        JSON,
        {},
        (400, "invalid_json"),
    ),
    (
        "a lone surrogate",
        b'{"items": [{"id": "a", "context": ["x"], "ground_truth": "\\ud800 '
        + MARK.encode()
        + b'"}]}',
        JSON,
        {},
        (400, "invalid_json"),
    ),
    (
        "a 5,000-digit scale",
        _body(scale=1).replace(b'"scale": 1', b'"scale": ' + b"9" * 5000),
        JSON,
        {},
        (400, "invalid_json"),
    ),
    ("scale 1.7e308", _body(scale=1.7e308), JSON, {}, (422, "invalid_request")),
    (
        "context_extractor.type a list",
        _body(context_extractor={"type": ["jmespath"]}),
        JSON,
        {},
        (422, "invalid_request"),
    ),
    (
        "context_extractor.type an object",
        _body(context_extractor={"type": {"a": 1}}),
        JSON,
        {},
        (422, "invalid_request"),
    ),
    (
        "context_extractor not an object",
        _body(context_extractor=[1]),
        JSON,
        {},
        (422, "invalid_request"),
    ),
    (
        "jmespath with thousands of brackets",
        _body(context_extractor={"type": "jmespath", "expression": "[" * 3000 + "]" * 3000}),
        JSON,
        {},
        (422, "invalid_request"),
    ),
    (
        "jmespath nested 300 deep by projections",
        _body(context_extractor={"type": "jmespath", "expression": "[*]" * 300}),
        JSON,
        {},
        (422, "invalid_request"),
    ),
    (
        "jmespath nested 900 deep by negations",
        _body(context_extractor={"type": "jmespath", "expression": "!" * 900 + "a"}),
        JSON,
        {},
        (422, "invalid_request"),
    ),
    ("model a list", _body(model=["gpt"]), JSON, {}, (422, "unknown_model")),
    ("model an object", _body(model={"a": 1}), JSON, {}, (422, "unknown_model")),
    ("name a number", _body(name=5), JSON, {}, (422, "invalid_request")),
    ("budget_usd NaN-like", _body(budget_usd="lots"), JSON, {}, (422, "invalid_request")),
    ("budget_usd negative", _body(budget_usd=-1), JSON, {}, (422, "invalid_request")),
    ("budget_tokens a fraction", _body(budget_tokens=1.5), JSON, {}, (422, "invalid_request")),
    ("items not a list", b'{"items": {"a": 1}}', JSON, {}, (422, "invalid_request")),
    ("not UTF-8", b'{"items": [{"id": "\xff"}]}', JSON, {}, (400, "invalid_json")),
    (
        "an NDJSON line nested 1,000 deep",
        b"[" * 1000 + b"]" * 1000 + b"\n",
        NDJSON,
        {},
        (422, "invalid_json"),
    ),
    (
        "an NDJSON line with NaN",
        b'{"id": "a", "context": ["x"], "input": NaN}\n',
        NDJSON,
        {},
        (422, "invalid_json"),
    ),
    (
        "NUL in a name parameter",
        b'{"id": "a", "context": ["x"]}\n',
        NDJSON,
        {"name": "a\x00"},
        (422, "invalid_request"),
    ),
    (
        "scale parameter 1e5000",
        b'{"id": "a", "context": ["x"]}\n',
        NDJSON,
        {"scale": "1e5000"},
        (422, "invalid_request"),
    ),
    (
        "context parameter with NaN",
        b'{"id": "a"}\n',
        NDJSON,
        {"context": "[NaN]"},
        (422, "invalid_request"),
    ),
    (
        "extractor parameter not JSON",
        b'{"id": "a"}\n',
        NDJSON,
        {"context_extractor": "{"},
        (422, "invalid_request"),
    ),
]


@pytest.mark.parametrize(
    ("name", "body", "headers", "params", "expected"), CASES, ids=[c[0] for c in CASES]
)
def test_a_bad_submission_is_a_4xx(
    api: str,
    key: str,
    name: str,
    body: bytes,
    headers: dict[str, str],
    params: dict[str, Any],
    expected: tuple[int, str],
) -> None:
    response = _raw(api, key, body, headers, **params)
    assert error_of(response) == expected, response.text
    assert httpx.get(f"{api}/healthz", timeout=5).status_code == 200


def test_the_jmespath_bomb_is_refused_quickly_and_small(api: str, key: str, served) -> None:
    import psutil

    process = psutil.Process(served[2].proc.pid)
    before = sum(p.memory_info().rss for p in [process, *process.children(recursive=True)])
    agent = {
        "id": "a",
        "ground_truth": "x",
        "input": {"inputMessages": []},
        "output": [{"id": "m", "role": "assistant", "content": "doc " * 100, "createdAt": "t"}],
    }
    body = {"items": [agent], "context_extractor": {"type": "jmespath", "expression": BOMB}}
    response = submit(api, key, body)
    assert error_of(response) == (422, "invalid_request")
    assert "larger than" in response.json()["error"]["message"]
    assert response.elapsed.total_seconds() < 5
    after = sum(p.memory_info().rss for p in [process, *process.children(recursive=True)])
    assert after - before < 50 * 1024 * 1024  # was +250 MB and 90 million stored characters


def test_bad_paths_and_cursors_are_4xx(api: str, key: str) -> None:
    run = submit(api, key, {"items": items(3)}).json()["id"]
    for path in (
        "/v1/runs/%00",
        "/v1/runs/a%00b/items",
        f"/v1/runs/{run}/items/%00",
        "/v1/runs/%ED%A0%80",
        "/v1/runs/" + "x" * 5000,
    ):
        response = httpx.get(f"{api}{path}", headers=bearer(key))
        assert error_of(response)[0] in (404, 414, 422), (path, response.text)
    for cursor in (
        base64.urlsafe_b64encode(b"99999999999").decode(),  # beyond int32
        base64.urlsafe_b64encode(b"9" * 40).decode(),
        "x" * 10_000,
        "%%%",
        base64.urlsafe_b64encode(b"-5").decode(),
        base64.urlsafe_b64encode("٣".encode()).decode(),  # a digit that is not 0-9
    ):
        response = httpx.get(
            f"{api}/v1/runs/{run}/items", params={"cursor": cursor}, headers=bearer(key)
        )
        assert error_of(response)[0] == 422, (cursor[:20], response.text)
    for params in ({"limit": "99999999999999999999"}, {"status": "nope"}, {"format": "xml"}):
        path = "/results" if "format" in params else "/items"
        response = httpx.get(f"{api}/v1/runs/{run}{path}", params=params, headers=bearer(key))
        assert error_of(response) == (422, "invalid_request")
    # a metadata field is compared as text by the database (found by schemathesis: a 500)
    for path in (
        f"/v1/runs/{run}?by=cat%00egory",
        f"/v1/compare?base={run}&candidate={run}&by=%00",
    ):
        response = httpx.get(f"{api}{path}", headers=bearer(key))
        assert error_of(response) == (422, "invalid_request"), (path, response.text)


def test_concurrent_twins_with_one_idempotency_key_get_one_run(api: str, key: str) -> None:
    headers = {**bearer(key), "Idempotency-Key": "twins-1", **JSON}
    body = json.dumps({"items": items(2000)}).encode()  # long enough to overlap
    answers: list[httpx.Response] = []

    def send() -> None:
        answers.append(httpx.post(f"{api}/v1/runs", content=body, headers=headers, timeout=120))

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [a.status_code for a in answers] == [202] * 8, [a.text[:200] for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1


def test_an_empty_idempotency_key_is_no_key(api: str, key: str) -> None:
    first = submit(api, key, {"items": items(1)}, headers={"Idempotency-Key": ""})
    second = submit(api, key, {"items": items(1)}, headers={"Idempotency-Key": ""})
    assert first.status_code == second.status_code == 202
    assert first.json()["id"] != second.json()["id"]


def test_the_log_holds_no_traceback_and_no_body(served) -> None:
    url, key, process = served
    assert httpx.get(f"{url}/healthz").status_code == 200
    log = process.output()
    assert "Traceback" not in log and " 500 " not in log
    assert MARK not in log
