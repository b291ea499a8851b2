"""Limits per client and overall, against a real API (keys required), Postgres and Redis:
submission rate per key, caps per project, body and line limits checked while the body
arrives (padding counts), slow bodies, and refused uploads that leave no rows behind."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlparse

import httpx
import psycopg
import pytest

from tests.integration.secured import bearer, error_of, items, make_key, secured_env, submit
from tests.services import start_api

NDJSON = {"content-type": "application/x-ndjson"}
LIMITS = {
    "submissions_per_minute": 6,  # one every 10 s...
    "submission_burst": 3,  # ...after 3 at once
    "max_active_runs_per_project": 4,
    "max_queued_items_per_project": 1000,
    "max_items_per_run": 500,
    "max_json_body_bytes": 64 * 1024,
    "max_item_bytes": 4096,
    "max_body_bytes": 1024 * 1024,
    "max_spool_bytes": 200 * 1024,
    "spool_memory_bytes": 16 * 1024,
    "body_grace": 2,
    "body_min_rate": 1000,
}


@pytest.fixture(scope="module")
def env(service_env: dict[str, str]) -> dict[str, str]:
    return secured_env(service_env, **LIMITS)


@pytest.fixture(scope="module")
def api(env: dict[str, str]) -> Iterator[str]:
    process, url = start_api(env)
    yield url
    process.stop()


def _ndjson(n: int, blank: int = 0, width: int = 0) -> bytes:
    pad = "x" * width
    lines = [json.dumps({"id": f"i{i}", "context": ["c"], "input": pad}) for i in range(n)]
    return ("\n".join(lines) + "\n" + "\n" * blank).encode()


def _items_in_db(env: dict[str, str]) -> int:
    url = env["RECALLQ_DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM items").fetchone()
    assert row is not None
    return int(row[0])


def test_submissions_are_rate_limited_per_key(api: str, env: dict[str, str]) -> None:
    key, other = make_key(env, "rate", "write"), make_key(env, "rate", "write")
    answers = [submit(api, key, {"items": items(1)}, params={"dry_run": "true"}) for _ in range(4)]
    assert [a.status_code for a in answers[:3]] == [200, 200, 200]
    assert error_of(answers[3]) == (429, "rate_limited")
    assert 1 <= int(answers[3].headers["retry-after"]) <= 10
    # another key of the same project has its own allowance
    assert submit(api, other, {"items": items(1)}, params={"dry_run": "true"}).status_code == 200


def test_active_runs_per_project_are_capped_before_the_body_is_read(
    api: str, env: dict[str, str]
) -> None:
    keys = [make_key(env, "active-cap", "write") for _ in range(2)]
    for n in range(4):
        assert submit(api, keys[n // 2], {"items": items(1)}).status_code == 202
    before = _items_in_db(env)
    refused = submit(api, keys[1], {"items": items(1)})
    assert error_of(refused) == (429, "too_many_active_runs")
    assert refused.headers["retry-after"]
    assert _items_in_db(env) == before


def test_unended_items_per_project_are_capped(api: str, env: dict[str, str]) -> None:
    keys = [make_key(env, "items-cap", "write") for _ in range(2)]
    for key in keys:
        response = httpx.post(
            f"{api}/v1/runs", content=_ndjson(500), headers={**bearer(key), **NDJSON}
        )
        assert response.status_code == 202, response.text
    before = _items_in_db(env)
    refused = httpx.post(
        f"{api}/v1/runs", content=_ndjson(10), headers={**bearer(keys[0]), **NDJSON}
    )
    assert error_of(refused) == (429, "too_many_queued_items")
    assert _items_in_db(env) == before


def test_bodies_lines_and_padding_are_limited(api: str, env: dict[str, str]) -> None:
    key = make_key(env, "bodies", "write")
    headers = {**bearer(key), **NDJSON}
    before = _items_in_db(env)
    cases = [
        (_ndjson(501), (413, "too_many_items")),
        (_ndjson(100, blank=450), (413, "too_many_items")),  # blank lines count
        (_ndjson(1, width=5000), (413, "item_too_large")),
        (b"\n" * 600, (413, "too_many_items")),
    ]
    for body, expected in cases:
        # each refusal is per key rate limited: wait out the allowance between cases
        response = httpx.post(f"{api}/v1/runs", content=body, headers=headers)
        if response.status_code == 429:
            time.sleep(float(response.headers["retry-after"]))
            response = httpx.post(f"{api}/v1/runs", content=body, headers=headers)
        assert error_of(response) == expected
    big_json = {"items": items(1), "name": None, "context": ["x" * 70_000]}
    response = submit(api, make_key(env, "bodies", "write"), big_json)
    assert error_of(response) == (413, "body_too_large")
    assert _items_in_db(env) == before


def test_a_refused_upload_is_refused_while_it_arrives_and_leaves_no_rows(
    api: str, env: dict[str, str]
) -> None:
    """200,001 items against a 500-item limit: refused at line 501, not after inserting."""
    key = make_key(env, "huge", "write")
    before = _items_in_db(env)
    body = _ndjson(200_001)
    host = urlparse(api)
    started = time.monotonic()
    with socket.create_connection((host.hostname, host.port), timeout=30) as sock:
        head = (
            f"POST /v1/runs HTTP/1.1\r\nHost: {host.netloc}\r\nAuthorization: Bearer {key}\r\n"
            # chunked: no Content-Length gives the size away, the limit holds as lines arrive
            "Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        sock.sendall(head.encode())
        with contextlib.suppress(OSError):  # the server may answer and close while we send
            for start in range(0, len(body), 65536):
                piece = body[start : start + 65536]
                sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            sock.sendall(b"0\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    elapsed = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"too_many_items" in answer
    assert elapsed < 5
    assert _items_in_db(env) == before


def test_a_run_that_fails_half_way_leaves_no_rows(api: str, env: dict[str, str]) -> None:
    key = make_key(env, "half", "write")
    before = _items_in_db(env)
    lines = _ndjson(400) + json.dumps({"id": "i7", "context": ["again"]}).encode() + b"\n"
    response = httpx.post(f"{api}/v1/runs", content=lines, headers={**bearer(key), **NDJSON})
    assert error_of(response) == (422, "duplicate_id")
    assert _items_in_db(env) == before


def _stalled_upload(api: str, key: str, sent: bytes, declared: int) -> socket.socket:
    host = urlparse(api)
    sock = socket.create_connection((host.hostname, host.port), timeout=30)
    head = (
        f"POST /v1/runs HTTP/1.1\r\nHost: {host.netloc}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/x-ndjson\r\nContent-Length: {declared}\r\n\r\n"
    )
    sock.sendall(head.encode() + sent)
    return sock


def _answer(sock: socket.socket) -> bytes:
    answer = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return answer
        answer += chunk


def test_a_body_that_stalls_gets_a_408_and_the_connection_ends(
    api: str, env: dict[str, str]
) -> None:
    key = make_key(env, "slow", "write")
    started = time.monotonic()
    with _stalled_upload(api, key, b'{"id": "a", "context": ["c"]}\n', 100_000) as sock:
        answer = _answer(sock)  # the server closes it: recv returns b""
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"request_timeout" in answer
    assert 1.5 < time.monotonic() - started < 15


def test_uploads_together_hold_at_most_the_spool_limit(api: str, env: dict[str, str]) -> None:
    holder = make_key(env, "spool", "write")
    held = _ndjson(400, width=330)[: 150 * 1024]  # 150 KiB of a 200 KiB budget, then it stalls
    with _stalled_upload(api, holder, held, 1024 * 1024) as sock:
        time.sleep(0.5)
        body = _ndjson(200, width=400)  # about 90 KiB more: past the budget
        response = httpx.post(
            f"{api}/v1/runs",
            content=body,
            headers={**bearer(make_key(env, "spool", "write")), **NDJSON},
        )
        assert error_of(response) == (503, "busy")
        assert response.headers["retry-after"]
        sock.close()
    time.sleep(0.5)  # the stalled upload ended: its share comes back
    again = httpx.post(
        f"{api}/v1/runs",
        content=_ndjson(50),
        headers={**bearer(make_key(env, "spool", "write")), **NDJSON},
    )
    assert again.status_code == 202, again.text


def test_other_media_types_are_415(api: str, env: dict[str, str]) -> None:
    key = make_key(env, "media", "write")
    response = httpx.post(
        f"{api}/v1/runs", content=b"id,context", headers={**bearer(key), "content-type": "text/csv"}
    )
    assert error_of(response) == (415, "unsupported_media_type")
