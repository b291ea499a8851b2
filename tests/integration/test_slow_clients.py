"""Slow clients cannot take the API down: 60 stalled NDJSON uploads and 60 stalled /results
readers at once (real sockets on 127.0.0.1), and /healthz and a run read still answer within
a second; no Postgres session is left idle in a transaction, during the stall or after."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlparse

import httpx
import psycopg
import pytest

from tests.integration.secured import bearer, make_key, secured_env
from tests.services import start_api

pytestmark = pytest.mark.alone  # reads answered within 1 s, the API idle

STALLED = 60
ITEMS = 20_000  # about 4 MB of results: far more than socket buffers hold


@pytest.fixture(scope="module")
def env(service_env: dict[str, str]) -> dict[str, str]:
    # a long grace, so the stalled uploads are still stalled (not refused) while we measure
    # and room for every stalled reader's stream on the one key (the cap per key is tested in
    # test_client_isolation.py)
    return secured_env(
        service_env,
        submissions_per_minute=0,
        body_grace=120,
        body_min_rate=1,
        max_result_streams_per_key=STALLED,
    )


@pytest.fixture(scope="module")
def served(env: dict[str, str]) -> Iterator[tuple[str, str, int]]:
    key = make_key(env, "slow-clients", "admin")
    process, url = start_api(env)
    yield url, key, process.proc.pid
    process.stop()


def _admin_url(env: dict[str, str]) -> str:
    return env["RECALLQ_DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")


def _sessions(env: dict[str, str]) -> dict[str, int]:
    """The test database's sessions by state (this check's own excluded)."""
    url = _admin_url(env)
    database = url.rsplit("/", 1)[1]
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT coalesce(state, '?'), count(*) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid() GROUP BY 1",
            (database,),
        ).fetchall()
    return {state: count for state, count in rows}


def _connect(api: str, receive_buffer: int | None = None) -> socket.socket:
    host = urlparse(api)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer:  # set before connecting: the window the client offers stays small
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(30)
    sock.connect((host.hostname, host.port))
    return sock


def _stalled_upload(api: str, key: str) -> socket.socket:
    sock = _connect(api)
    line = json.dumps({"id": "a", "context": ["c"]}).encode() + b"\n"
    head = (
        f"POST /v1/runs HTTP/1.1\r\nHost: {urlparse(api).netloc}\r\nAuthorization: Bearer {key}"
        f"\r\nContent-Type: application/x-ndjson\r\nContent-Length: {10 * 1024 * 1024}\r\n\r\n"
    )
    sock.sendall(head.encode() + line)  # ...and nothing more
    return sock


def _stalled_reader(api: str, key: str, run_id: str) -> socket.socket:
    sock = _connect(api, receive_buffer=4096)
    head = (
        f"GET /v1/runs/{run_id}/results HTTP/1.1\r\nHost: {urlparse(api).netloc}\r\n"
        f"Authorization: Bearer {key}\r\n\r\n"
    )
    sock.sendall(head.encode())
    assert sock.recv(64).startswith(b"HTTP/1.1 200")  # it started; then we stop reading
    return sock


def _settle(pid: int, timeout: float = 60) -> float:
    """Wait until the API process is nearly idle (its readers stalled, not still being
    served); returns how long that took."""
    import psutil

    process = psutil.Process(pid)
    started = time.monotonic()
    process.cpu_percent(None)
    while time.monotonic() - started < timeout:
        if process.cpu_percent(0.5) < 15:
            break
    return time.monotonic() - started


def _timed(call) -> float:
    started = time.monotonic()
    response = call()
    assert response.status_code == 200, response.text[:200]
    return time.monotonic() - started


def test_stalled_uploads_and_readers_block_nothing(served, env: dict[str, str]) -> None:
    api, key, pid = served
    lines = "".join(
        json.dumps({"id": f"i{i}", "context": ["a passage"], "ground_truth": "A fact."}) + "\n"
        for i in range(ITEMS)
    )
    created = httpx.post(
        f"{api}/v1/runs",
        content=lines.encode(),
        headers={**bearer(key), "content-type": "application/x-ndjson"},
        timeout=120,
    )
    assert created.status_code == 202, created.text
    run_id = created.json()["id"]

    sockets = [_stalled_upload(api, key) for _ in range(STALLED)]
    sockets += [_stalled_reader(api, key, run_id) for _ in range(STALLED)]
    try:
        # the readers' first pages fill every buffer on the way; then the API has nothing to do
        settled = _settle(pid)
        with httpx.Client(timeout=10) as client:
            health = max(_timed(lambda: client.get(f"{api}/healthz")) for _ in range(5))
            read = max(
                _timed(lambda: client.get(f"{api}/v1/runs/{run_id}", headers=bearer(key)))
                for _ in range(5)
            )
            items = _timed(lambda: client.get(f"{api}/v1/runs/{run_id}/items", headers=bearer(key)))
        during = _sessions(env)
        print(
            f"stalled after {settled:.1f} s; healthz {health:.3f} s, run read {read:.3f} s, "
            f"items {items:.3f} s; sessions {during}"
        )
        assert health < 1.0 and read < 1.0 and items < 1.0
        assert during.get("idle in transaction", 0) == 0, during
        assert during.get("active", 0) <= 2, during  # nobody is holding a statement open
    finally:
        for sock in sockets:
            sock.close()

    time.sleep(1)
    after = _sessions(env)
    assert after.get("idle in transaction", 0) == 0, after
    # the API is whole: a full download still gets every item
    with httpx.stream(
        "GET", f"{api}/v1/runs/{run_id}/results", headers=bearer(key), timeout=120
    ) as response:
        assert sum(1 for _ in response.iter_lines()) == ITEMS
