"""GET /metrics on a real API process: who may read it (the metrics token, else this host
only), and what it never shows (a key, an item's text, an id)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.faults import make_items, submit
from tests.launcher import run_recallq
from tests.services import REPO, start_api

TOKEN = "mt-0123456789abcdef"


@pytest.fixture(scope="module")
def api_with_token(service_env: dict[str, str]) -> Iterator[str]:
    process, url = start_api({**service_env, "RECALLQ_METRICS_TOKEN": TOKEN})
    yield url
    process.stop()


@pytest.fixture(scope="module")
def api_without_token(service_env: dict[str, str]) -> Iterator[str]:
    process, url = start_api(service_env)
    yield url
    process.stop()


def _error(response: httpx.Response) -> str:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    return str(body["error"]["code"])


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": "Bearer"},
    ],
)
def test_without_the_metrics_token_it_is_401(api_with_token: str, headers: dict) -> None:
    response = httpx.get(f"{api_with_token}/metrics", headers=headers)
    assert response.status_code == 401
    assert _error(response) == "unauthenticated"
    assert response.headers["www-authenticate"] == "Bearer"
    assert "recallq_" not in response.text


def test_with_the_token_it_shows_counts_never_keys_texts_or_ids(
    api_with_token: str, service_env: dict[str, str]
) -> None:
    items = make_items("secretcontent", 3)
    run_id = submit(api_with_token, items)
    assert httpx.get(f"{api_with_token}/v1/runs/{run_id}").status_code == 200
    response = httpx.get(f"{api_with_token}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert 'recallq_items_waiting{model="stub-judge"}' in text
    assert 'recallq_runs_active{model="stub-judge"} 1.0' in text
    assert 'recallq_breaker_open{model="stub-judge"} 0.0' in text
    assert 'route="/v1/runs/{run_id}"' in text  # the template, not the path
    for secret in (
        TOKEN,
        service_env["STUB_API_KEY"],
        service_env["RECALLQ_DATABASE_URL"],
        run_id,
        "secretcontent",  # items' ids and texts
        "Sample ",
    ):
        assert secret not in text, secret


def test_without_a_token_only_this_host_may_read_it(api_without_token: str) -> None:
    assert httpx.get(f"{api_without_token}/metrics").status_code == 200
    # a proxy on this host forwarding a client from elsewhere: uvicorn takes the client from
    # X-Forwarded-For (it trusts the header from loopback), so that client is refused
    remote = httpx.get(f"{api_without_token}/metrics", headers={"X-Forwarded-For": "203.0.113.9"})
    assert remote.status_code == 403
    assert _error(remote) == "forbidden"
    assert "RECALLQ_METRICS_TOKEN" in remote.json()["error"]["message"]


def test_an_invented_method_or_path_adds_no_series(api_without_token: str) -> None:
    for i in range(5):
        httpx.request("BREW", f"{api_without_token}/v1/runs/x{i}")
        httpx.get(f"{api_without_token}/no/such/path/{i}")
    text = httpx.get(f"{api_without_token}/metrics").text
    assert "BREW" not in text and "/no/such" not in text
    assert 'method="other",route="/v1/runs/{run_id}"' in text
    assert 'route="unmatched"' in text


def test_a_worker_metrics_port_in_use_is_one_line_and_exit_2(service_env: dict[str, str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_recallq(
            ["worker", "--metrics-port", str(port)], env=service_env, cwd=REPO, timeout=120
        )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"recallq: --metrics-port: cannot serve metrics on 127.0.0.1:{port}: Address already in use"
    )
