"""With auth off, the API answers a Host only when it is exactly an allowed name or address
with an optional port (api.guards, run as the ASGI middleware it is, around an app that
answers 200)."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import pytest

from api.guards import RequestGuards, allowed_hosts, host_name


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _status(host: bytes | None, configured: str = "", server: str = "127.0.0.1") -> int:
    guards = RequestGuards(_ok, auth_off=True, hosts=allowed_hosts(configured))
    headers = [] if host is None else [(b"host", host)]
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/v1/runs",
        "headers": headers,
        "server": (server, 8094),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    asyncio.run(guards(scope, receive, send))
    return int(sent[0]["status"])


@pytest.mark.parametrize(
    "host",
    [
        b"localhost",
        b"localhost:8094",
        b"LOCALHOST:8094",
        b"127.0.0.1:8094",
        b"[::1]:8094",
        b"[::1]",
        b"api:8000",  # RECALLQ_ALLOWED_HOSTS=api
        b"10.0.0.5:8094",  # the address the connection came in on
    ],
)
def test_a_loopback_or_allowed_name_with_an_optional_port_is_answered(host: bytes) -> None:
    assert _status(host, configured="api", server="10.0.0.5") == 200


@pytest.mark.parametrize(
    "host",
    [
        b"localhost:8094@evil.com",  # issue 28: both were answered
        b"localhost:8094 evil.com",
        b"evil.com",
        b"localhost.evil.com",
        b"127.0.0.1.evil.com:8094",
        b"localhost.",
        b"::1",  # an IPv6 address in a Host is in brackets
        b"[::1]evil",
        b"localhost:",
        b"localhost:80:80",
        b"localhost/x",
        b"",
        None,
    ],
)
def test_any_other_host_is_misdirected(host: bytes | None) -> None:
    assert _status(host) == 421


def test_host_names_come_without_port_and_brackets() -> None:
    assert host_name("[::1]:80") == "::1" and host_name("LocalHost:1") == "localhost"
    assert host_name("localhost:8094@evil.com") is None
    assert allowed_hosts(" api:8000 , [fe80::1], bad host") >= {"api", "fe80::1", "localhost"}
    assert "bad host" not in allowed_hosts("bad host")
