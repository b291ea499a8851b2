"""The web pages over real HTTP against an API that requires keys (Postgres, Redis): sign-in
and its cookie, project scoping, CSRF on cancel and retry, roles, bounded parameters, and the
key never coming back in any answer."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

import httpx
import pytest

from tests.integration.secured import (
    bearer,
    items,
    key_id_of,
    make_key,
    recallq,
    secured_env,
    submit,
)
from tests.services import start_api

CSRF = re.compile(r'name="csrf_token" value="([^"]*)"')


@pytest.fixture(scope="module")
def env(service_env: dict[str, str]) -> dict[str, str]:
    return secured_env(service_env, submissions_per_minute=0, max_active_runs_per_project=1000)


@pytest.fixture(scope="module")
def keys(env: dict[str, str]) -> dict[str, str]:
    return {
        "read": make_key(env, "pages", "read"),
        "write": make_key(env, "pages", "write"),
        "other": make_key(env, "elsewhere", "admin"),
        "revoked": make_key(env, "pages", "write", label="pages-to-revoke"),
    }


@pytest.fixture(scope="module")
def api(env: dict[str, str], keys: dict[str, str]) -> Iterator[str]:
    process, url = start_api(env)
    yield url
    process.stop()


class Seen:
    """Every answer the tests receive, to look for the keys in afterwards."""

    def __init__(self) -> None:
        self.responses: list[httpx.Response] = []

    def __call__(self, response: httpx.Response) -> None:
        response.read()
        self.responses.append(response)


@pytest.fixture(scope="module")
def seen() -> Seen:
    return Seen()


def _browser(api: str, seen: Seen) -> httpx.Client:
    return httpx.Client(base_url=api, timeout=30, event_hooks={"response": [seen]})


@contextmanager
def _signed_in(api: str, seen: Seen, key: str) -> Iterator[httpx.Client]:
    with _browser(api, seen) as client:
        response = client.post("/signin", data={"key": key, "next": "/"})
        assert response.status_code == 303, response.text
        assert response.headers["location"] == "/"
        yield client


def _run(api: str, key: str) -> str:
    response = submit(api, key, {"items": items(3)})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def _csrf(client: httpx.Client, path: str) -> str:
    page = client.get(path)
    assert page.status_code == 200, page.text
    match = CSRF.search(page.text)
    assert match is not None and match.group(1)
    return match.group(1)


def test_pages_without_a_session_redirect_to_sign_in(api: str, seen: Seen) -> None:
    with _browser(api, seen) as client:
        for path in ("/", "/runs/x", "/runs/x/items?sort=score", "/compare"):
            response = client.get(path)
            assert response.status_code == 303, path
            assert response.headers["location"] == "/signin?next=" + quote(path, safe="")
        form = client.get("/signin?next=/runs/x")
        assert form.status_code == 200
        assert 'name="key"' in form.text and 'value="/runs/x"' in form.text


def test_sign_in_sets_a_strict_http_only_cookie_that_is_not_the_key(
    api: str, seen: Seen, keys: dict[str, str]
) -> None:
    with _browser(api, seen) as client:
        refused = client.post("/signin", data={"key": "rq_" + "B" * 43})
        assert refused.status_code == 401 and "unknown or revoked" in refused.text
        assert "set-cookie" not in refused.headers
        response = client.post("/signin", data={"key": keys["read"], "next": "//evil.example/"})
        assert response.status_code == 303 and response.headers["location"] == "/"
        cookie = response.headers["set-cookie"]
        assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
        assert keys["read"] not in cookie and keys["read"][3:20] not in cookie
        page = client.get("/")
        assert page.status_code == 200 and 'data-testid="runs"' in page.text
        assert "project pages" in page.text
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp


def test_a_run_page_shows_the_json_apis_numbers(api: str, seen: Seen, keys: dict[str, str]) -> None:
    run_id = _run(api, keys["write"])
    with _signed_in(api, seen, keys["read"]) as client:
        page = client.get(f"/runs/{run_id}")
        assert page.status_code == 200
        listed = client.get("/")
        assert f'data-run-id="{run_id}"' in listed.text
    view = httpx.get(f"{api}/v1/runs/{run_id}", headers=bearer(keys["read"])).json()
    for name, value in view["counts"].items():
        assert f'data-count="{name}" data-value="{value}"' in page.text
    mean = view["summary"]["mean_score"]
    assert f'data-testid="mean-score" data-value="{"" if mean is None else mean}"' in page.text
    assert 'svg data-testid="histogram"' in page.text
    assert page.text.count('<rect class="bar"') == len(view["summary"]["histogram"]["counts"])


def test_another_projects_run_is_the_same_404_page_as_an_unknown_run(
    api: str, seen: Seen, keys: dict[str, str]
) -> None:
    theirs = _run(api, keys["other"])
    with _signed_in(api, seen, keys["write"]) as client:
        pages: dict[str, set[str]] = {}
        for run_id in (theirs, "no-such-run"):
            for suffix in ("", "/items", "/items/q0"):
                response = client.get(f"/runs/{run_id}{suffix}")
                assert response.status_code == 404, (run_id, suffix)
                pages.setdefault(suffix, set()).add(response.text.replace(run_id, "ID"))
        assert all(len(texts) == 1 for texts in pages.values())
        compared = client.get("/compare", params={"base": theirs, "candidate": theirs})
        assert compared.status_code == 404
        token = _csrf(client, "/")
        cancel = client.post(f"/runs/{theirs}/cancel", data={"csrf_token": token})
        assert cancel.status_code == 404
    still = httpx.get(f"{api}/v1/runs/{theirs}", headers=bearer(keys["other"])).json()
    assert still["status"] != "cancelled"


def test_cancel_needs_the_sessions_csrf_token_and_this_sites_origin(
    api: str, seen: Seen, keys: dict[str, str]
) -> None:
    run_id = _run(api, keys["write"])
    with _signed_in(api, seen, keys["write"]) as client:
        token = _csrf(client, f"/runs/{run_id}")
        assert 'data-testid="cancel"' in client.get(f"/runs/{run_id}").text
        forged = [
            client.post(f"/runs/{run_id}/cancel", data={}),
            client.post(f"/runs/{run_id}/cancel", data={"csrf_token": "x" + token[1:]}),
            client.post(
                f"/runs/{run_id}/cancel",
                data={"csrf_token": token},
                headers={"Origin": "https://evil.example"},
            ),
            client.post(  # what a browser sends from another site under no-referrer
                f"/runs/{run_id}/cancel",
                data={"csrf_token": token},
                headers={"Origin": "null", "Sec-Fetch-Site": "cross-site"},
            ),
        ]
        assert [response.status_code for response in forged] == [403, 403, 403, 403]
        with _signed_in(api, seen, keys["write"]) as other_session:
            # a token is bound to its own session, not to the key
            stolen = other_session.post(f"/runs/{run_id}/cancel", data={"csrf_token": token})
            assert stolen.status_code == 403
        view = httpx.get(f"{api}/v1/runs/{run_id}", headers=bearer(keys["write"])).json()
        assert view["status"] != "cancelled"
        same_site = {"Origin": "null", "Sec-Fetch-Site": "same-origin"}  # a browser's own form
        done = client.post(f"/runs/{run_id}/cancel", data={"csrf_token": token}, headers=same_site)
        assert done.status_code == 303
        assert done.headers["location"] == f"/runs/{run_id}?done=cancelled"
        assert "Run cancelled" in client.get(done.headers["location"]).text
    view = httpx.get(f"{api}/v1/runs/{run_id}", headers=bearer(keys["write"])).json()
    assert view["status"] == "cancelled" and view["cancel_reason"] == "user"


def test_a_read_key_may_not_cancel_or_retry(api: str, seen: Seen, keys: dict[str, str]) -> None:
    run_id = _run(api, keys["write"])
    with _signed_in(api, seen, keys["read"]) as client:
        token = _csrf(client, f"/runs/{run_id}")
        for action in ("cancel", "retry"):
            response = client.post(f"/runs/{run_id}/{action}", data={"csrf_token": token})
            assert response.status_code == 403, action
    view = httpx.get(f"{api}/v1/runs/{run_id}", headers=bearer(keys["read"])).json()
    assert view["status"] != "cancelled"


def test_retry_from_the_page_answers_as_the_api_does(
    api: str, seen: Seen, keys: dict[str, str]
) -> None:
    run_id = _run(api, keys["write"])
    with _signed_in(api, seen, keys["write"]) as client:
        token = _csrf(client, f"/runs/{run_id}")
        retried = client.post(f"/runs/{run_id}/retry", data={"csrf_token": token})
        assert retried.status_code == 303
        assert retried.headers["location"] == f"/runs/{run_id}?done=nothing-to-retry"
        cancelled = client.post(f"/runs/{run_id}/cancel", data={"csrf_token": token})
        assert cancelled.status_code == 303
        refused = client.post(f"/runs/{run_id}/retry", data={"csrf_token": token})
        assert refused.status_code == 409  # as POST /v1/runs/{id}/retry on a cancelled run


def test_junk_parameters_are_a_400_page(api: str, seen: Seen, keys: dict[str, str]) -> None:
    run_id = _run(api, keys["write"])
    junk = [
        "/?status=nope",
        "/?name=" + "n" * 201,
        "/?name=a%00b",
        "/?cursor=not-a-cursor",
        f"/runs/{run_id}/items?min_score=abc",
        f"/runs/{run_id}/items?min_score=nan",
        f"/runs/{run_id}/items?max_score=1e999",
        f"/runs/{run_id}/items?max_score=2",
        f"/runs/{run_id}/items?min_score=-0.5",
        f"/runs/{run_id}/items?status=lost",
        f"/runs/{run_id}/items?sort=name",
        f"/runs/{run_id}/items?q=" + "x" * 201,
        f"/runs/{run_id}/items?q=%00",
        f"/runs/{run_id}/items?cursor=%%%",
        f"/runs/{run_id}/items?cursor=WzEsIC0xXQ",  # [1, -1]: decodes, but no index is < 0
        f"/runs/{run_id}?by=" + "b" * 201,
        "/compare?base=" + "r" * 201 + "&candidate=x",
    ]
    with _signed_in(api, seen, keys["read"]) as client:
        for path in junk:
            response = client.get(path)
            assert response.status_code == 400, (path, response.status_code)
            assert "text/html" in response.headers["content-type"]
        fine = client.get(
            f"/runs/{run_id}/items",
            params={"min_score": "0", "max_score": "1", "q": "q1", "sort": "-score"},
        )
        assert fine.status_code == 200 and 'data-testid="items"' in fine.text
        assert client.get(f"/runs/{run_id}/items/{'i' * 300}").status_code == 404
        assert client.get("/runs/" + "r" * 300).status_code == 404


def test_a_revoked_keys_session_ends_at_once(
    api: str, env: dict[str, str], seen: Seen, keys: dict[str, str]
) -> None:
    with _signed_in(api, seen, keys["revoked"]) as client:
        assert client.get("/").status_code == 200
        revoked = recallq(env, "keys", "revoke", key_id_of(env, "pages-to-revoke"))
        assert revoked.returncode == 0, revoked.stderr
        assert client.get("/").status_code == 303


def test_a_forged_cookie_is_no_session(api: str, seen: Seen, keys: dict[str, str]) -> None:
    with _signed_in(api, seen, keys["write"]) as client:
        key_id, expires, nonce, mac = client.cookies["recallq_session"].split(".")
        forged = [
            f"{key_id}.{int(expires) + 1}.{nonce}.{mac}",  # a longer session
            f"{key_id}.{expires}.{nonce}x.{mac}",
            f"{key_id}.{expires}.{nonce}.{'A' * len(mac)}",
            f"{key_id}.1.{nonce}.{mac}",  # expired
            "x" * 300,
        ]
        for cookie in forged:
            client.cookies.set("recallq_session", cookie)
            assert client.get("/").status_code == 303, cookie


def test_sign_out_ends_the_session(api: str, seen: Seen, keys: dict[str, str]) -> None:
    with _signed_in(api, seen, keys["read"]) as client:
        assert client.post("/signout", data={}).status_code == 403
        token = _csrf(client, "/")
        response = client.post("/signout", data={"csrf_token": token})
        assert response.status_code == 303 and response.headers["location"] == "/signin"
        assert client.get("/").status_code == 303


def test_the_keys_never_come_back(seen: Seen, keys: dict[str, str]) -> None:
    """Last in this module: every answer the tests above received, bodies and headers."""
    assert len(seen.responses) > 50
    for response in seen.responses:
        text = response.text + "\n".join(f"{k}: {v}" for k, v in response.headers.items())
        for key in keys.values():
            assert key not in text and key[3:] not in text, response.url
