"""The per-key cap on /results streams, probed: readers that stop reading hold their key's
slots and nobody else's, a reader that hangs up gives its slot back, and a stalled reader is
cut. A real API (keys required, 2 streams per key, 10 s stall timeout), worker, Postgres, Redis."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from urllib.parse import urlparse

import httpx
import pytest

from tests.integration.secured import (
    api_and_worker,
    bearer,
    completed_run,
    error_of,
    make_key,
    secured_env,
)

STALL_SECONDS = 30  # long enough for a loaded machine to check the cap meanwhile


@pytest.fixture(scope="module")
def env(service_env: dict[str, str]) -> dict[str, str]:
    return secured_env(
        service_env,
        submissions_per_minute=0,
        max_result_streams_per_key=2,
        results_stall_timeout=STALL_SECONDS,
    )


@pytest.fixture(scope="module")
def keys(env: dict[str, str]) -> dict[str, str]:
    return {
        "a": make_key(env, "streams", "read", label="stream-a"),
        "b": make_key(env, "streams", "read", label="stream-b"),
        "writer": make_key(env, "streams", "write", label="stream-writer"),
    }


@pytest.fixture(scope="module")
def api(env: dict[str, str], keys: dict[str, str]) -> Iterator[str]:
    with api_and_worker(env) as url:
        yield url


@pytest.fixture(scope="module")
def run(api: str, keys: dict[str, str]) -> str:
    """About 8 MB of results: far more than the socket buffers of a reader that reads nothing."""
    filler = "Background passage about nothing in particular. " * 800
    items = [
        {"id": f"s{i}", "ground_truth": f"Fact {i} holds.", "context": [f"Fact {i} holds.", filler]}
        for i in range(200)
    ]
    return str(completed_run(api, keys["writer"], {"items": items, "model": "local/lexical"})["id"])


def _stalled_reader(api: str, key: str, run: str) -> socket.socket:
    """A client that asks for the results, reads the status line and then nothing more.

    Its stream holds a slot once the status line is 200. A 429 means an earlier stream (a
    probe that just hung up) still held the slot: the API gives it back when it sees the
    hang-up, so ask again."""
    address = urlparse(api)
    request = (
        f"GET /v1/runs/{run}/results?format=jsonl HTTP/1.1\r\nHost: {address.netloc}\r\n"
        f"Authorization: Bearer {key}\r\n\r\n"
    )
    deadline = time.monotonic() + 60
    while True:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(60)
        sock.connect((address.hostname, address.port))
        sock.sendall(request.encode())
        head = sock.recv(64)
        if head.startswith(b"HTTP/1.1 200"):
            sock.settimeout(None)
            return sock
        sock.close()
        assert head.startswith(b"HTTP/1.1 429") and time.monotonic() < deadline, head
        time.sleep(0.2)


def _status_of_a_stream(api: str, key: str, run: str) -> int:
    """Open a stream, read its first bytes, hang up."""
    with (
        httpx.Client(timeout=30) as client,
        client.stream("GET", f"{api}/v1/runs/{run}/results", headers=bearer(key)) as response,
    ):
        if response.status_code == 429:
            response.read()
            assert error_of(response) == (429, "too_many_streams")
            assert response.headers["retry-after"]
        else:
            next(response.iter_bytes())
        return response.status_code


def _wait_for(api: str, key: str, run: str, status: int, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    while True:
        got = _status_of_a_stream(api, key, run)
        if got == status or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_stalled_readers_hold_their_own_keys_slots_only(
    api: str, keys: dict[str, str], run: str
) -> None:
    stalled = [_stalled_reader(api, keys["a"], run) for _ in range(2)]
    try:
        assert _wait_for(api, keys["a"], run, 429, 10) == 429
        assert _status_of_a_stream(api, keys["b"], run) == 200  # another key is not starved
        stalled.pop().close()  # a reader hangs up: its slot comes back
        assert _wait_for(api, keys["a"], run, 200, 10) == 200
    finally:
        for sock in stalled:
            sock.close()


def test_a_reader_that_stalls_past_the_timeout_gives_its_slot_back(
    api: str, keys: dict[str, str], run: str
) -> None:
    stalled = [_stalled_reader(api, keys["a"], run) for _ in range(2)]
    try:
        assert _wait_for(api, keys["a"], run, 429, 20) == 429
        # without closing anything: the API cuts both after STALL_SECONDS of no reading
        assert _wait_for(api, keys["a"], run, 200, STALL_SECONDS * 6) == 200
    finally:
        for sock in stalled:
            sock.close()


def test_streams_that_end_give_their_slots_back(api: str, keys: dict[str, str], run: str) -> None:
    for _ in range(5):  # more than the cap, one after the other
        with httpx.Client(timeout=60) as client:
            done = client.get(f"{api}/v1/runs/{run}/results", headers=bearer(keys["b"]))
        assert done.status_code == 200 and done.text.count("\n") == 200
    unknown = httpx.get(f"{api}/v1/runs/nope/results", headers=bearer(keys["b"]))
    for _ in range(3):  # a refused stream takes no slot either
        assert (
            httpx.get(f"{api}/v1/runs/nope/results", headers=bearer(keys["b"])).status_code == 404
        )
    assert unknown.status_code == 404 and _status_of_a_stream(api, keys["b"], run) == 200
