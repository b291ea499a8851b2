"""Keys, roles and projects against a real API (keys required), Postgres and Redis.

Every /v1 route x {no key, unknown key, revoked key, read key, another project's key, write
key, admin key} gives the documented status; another project's run is exactly as missing as
a run that never existed; Idempotency-Keys belong to their project.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.integration.secured import (
    bearer,
    cli_key,
    error_of,
    items,
    key_id_of,
    make_key,
    recallq,
    secured_env,
    submit,
)
from tests.services import start_api

WHO = ("none", "unknown", "revoked", "read", "other", "write", "admin")


@pytest.fixture(scope="module")
def env(service_env: dict[str, str]) -> dict[str, str]:
    return secured_env(service_env, submissions_per_minute=0, max_active_runs_per_project=1000)


@pytest.fixture(scope="module")
def keys(env: dict[str, str]) -> dict[str, str | None]:
    made: dict[str, str | None] = {
        "read": make_key(env, "alpha", "read"),
        "write": make_key(env, "alpha", "write"),
        "admin": cli_key(env, "alpha", "admin"),  # `recallq keys create`, as operators do
        "other": make_key(env, "beta", "admin"),
        "revoked": make_key(env, "alpha", "admin", label="to-revoke"),
    }
    revoked = recallq(env, "keys", "revoke", key_id_of(env, "to-revoke"))
    assert revoked.returncode == 0, revoked.stderr
    made["unknown"] = "rq_" + "A" * 43  # the right shape, never made
    made["none"] = None
    return made


@pytest.fixture(scope="module")
def api(env: dict[str, str], keys: dict[str, str | None]) -> Iterator[str]:
    process, url = start_api(env)
    yield url
    process.stop()


def _run(api: str, key: str | None, cancelled: bool = False) -> str:
    response = submit(api, key, {"items": items(2)})
    assert response.status_code == 202, response.text
    run_id = str(response.json()["id"])
    if cancelled:
        assert httpx.post(f"{api}/v1/runs/{run_id}/cancel", headers=bearer(key)).status_code == 200
    return run_id


def _expected(kind: str, who: str) -> int:
    if who in ("none", "unknown", "revoked"):
        return 401
    ok = {"read": 200, "create": 202, "dry_run": 200, "cancel": 200, "retry": 202, "delete": 204}
    if kind == "delete":
        return {"read": 403, "write": 403, "other": 404, "admin": 204}[who]
    if who == "read" and kind not in ("read",):
        return 403
    if who == "other" and kind not in ("create", "dry_run"):
        return 404  # another project's run: not found, whatever the key may do at home
    return ok[kind]


Call = Callable[[str, str | None, str], httpx.Response]


def _routes(api: str) -> dict[str, tuple[str, str, Call]]:
    """name -> (kind, run state it needs, call(api, key, run_id))."""

    def get(path: str) -> Call:
        return lambda api, key, run: httpx.get(f"{api}{path.format(run=run)}", headers=bearer(key))

    def post(path: str) -> Call:
        return lambda api, key, run: httpx.post(f"{api}{path.format(run=run)}", headers=bearer(key))

    return {
        "POST /v1/runs": (
            "create",
            "none",
            lambda api, key, run: submit(api, key, {"items": items(1)}),
        ),
        "POST /v1/runs?dry_run": (
            "dry_run",
            "none",
            lambda api, key, run: submit(api, key, {"items": items(1)}, params={"dry_run": "true"}),
        ),
        "GET run": ("read", "queued", get("/v1/runs/{run}")),
        "GET items": ("read", "queued", get("/v1/runs/{run}/items")),
        "GET item": ("read", "queued", get("/v1/runs/{run}/items/q0")),
        "GET results": ("read", "queued", get("/v1/runs/{run}/results")),
        "GET results csv": ("read", "queued", get("/v1/runs/{run}/results?format=csv")),
        "POST cancel": ("cancel", "queued", post("/v1/runs/{run}/cancel")),
        "POST retry": ("retry", "queued", post("/v1/runs/{run}/retry")),
        "DELETE run": (
            "delete",
            "cancelled",
            lambda api, key, run: httpx.delete(f"{api}/v1/runs/{run}", headers=bearer(key)),
        ),
    }


def test_every_route_by_every_kind_of_key(api: str, keys: dict[str, str | None]) -> None:
    wrong: dict[str, dict[str, Any]] = {}
    for name, (kind, needs, call) in _routes(api).items():
        for who in WHO:
            run = (
                _run(api, keys["admin"], cancelled=needs == "cancelled") if needs != "none" else ""
            )
            response = call(api, keys[who], run)
            want = _expected(kind, who)
            if response.status_code != want:
                wrong.setdefault(name, {})[who] = (response.status_code, response.text[:200])
            elif want >= 400:
                status, code = error_of(response)
                expected_code = {401: "unauthenticated", 403: "forbidden", 404: "not_found"}
                if code != expected_code[status]:
                    wrong.setdefault(name, {})[who] = (status, code)
                if (
                    status == 401
                    and "bearer" not in response.headers.get("www-authenticate", "").lower()
                ):
                    wrong.setdefault(name, {})[who] = "401 without WWW-Authenticate: Bearer"
    assert wrong == {}


def test_a_read_key_reads_every_run_of_its_project(api: str, keys: dict[str, str | None]) -> None:
    run = _run(api, keys["write"])  # made with another key of the project
    response = httpx.get(f"{api}/v1/runs/{run}", headers=bearer(keys["read"]))
    assert response.status_code == 200 and response.json()["id"] == run


def test_another_projects_run_is_exactly_as_missing_as_no_run(
    api: str, keys: dict[str, str | None]
) -> None:
    theirs = _run(api, keys["admin"])
    never = str(uuid.uuid4())
    for path in ("", "/items", "/items/q0", "/results"):
        seen = httpx.get(f"{api}/v1/runs/{theirs}{path}", headers=bearer(keys["other"]))
        missing = httpx.get(f"{api}/v1/runs/{never}{path}", headers=bearer(keys["other"]))
        assert seen.status_code == missing.status_code == 404
        assert seen.json()["error"]["message"].replace(theirs, "ID") == missing.json()["error"][
            "message"
        ].replace(never, "ID")
        assert set(seen.headers) - {"date", "content-length"} == set(missing.headers) - {
            "date",
            "content-length",
        }


def test_idempotency_keys_belong_to_their_project(api: str, keys: dict[str, str | None]) -> None:
    headers = {"Idempotency-Key": "nightly-2026-11-30"}
    alpha = submit(api, keys["write"], {"items": items(3), "name": "alpha's"}, headers=headers)
    beta = submit(api, keys["other"], {"items": items(5), "scale": 7}, headers=headers)
    assert alpha.status_code == beta.status_code == 202
    assert alpha.json()["id"] != beta.json()["id"]
    assert beta.json()["name"] is None and beta.json()["counts"]["total"] == 5
    again = submit(api, keys["other"], {"items": items(5), "scale": 7}, headers=headers)
    assert again.json()["id"] == beta.json()["id"]
    # a reuse within beta names what differs from beta's run only: nothing of alpha's
    reused = submit(api, keys["other"], {"items": items(3), "name": "alpha's"}, headers=headers)
    assert error_of(reused) == (422, "idempotency_key_reused")
    assert "alpha" not in reused.json()["error"]["message"]


def test_a_revoked_key_stops_at_once(api: str, env: dict[str, str]) -> None:
    key = make_key(env, "alpha", "read", label="short-lived")
    assert httpx.get(f"{api}/v1/runs/{uuid.uuid4()}", headers=bearer(key)).status_code == 404
    assert recallq(env, "keys", "revoke", key_id_of(env, "short-lived")).returncode == 0
    response = httpx.get(f"{api}/v1/runs/{uuid.uuid4()}", headers=bearer(key))
    assert error_of(response) == (401, "unauthenticated")


def test_keys_list_never_shows_a_key(env: dict[str, str], keys: dict[str, str | None]) -> None:
    listed = recallq(env, "keys", "list")
    assert listed.returncode == 0
    for key in keys.values():
        if key is not None:
            assert key not in listed.stdout
    assert "alpha" in listed.stdout and "revoked" in listed.stdout
    assert listed.stdout.splitlines()[0].split()[:5] == ["id", "project", "role", "prefix", "state"]


def test_keys_list_shows_each_keys_last_use(api: str, env: dict[str, str]) -> None:
    key = make_key(env, "alpha", "read", label="last-use-probe")

    def row() -> str:
        listed = recallq(env, "keys", "list", "--project", "alpha")
        assert listed.returncode == 0, listed.stderr
        assert "last used (UTC)" in listed.stdout.splitlines()[0]
        return next(line for line in listed.stdout.splitlines() if "last-use-probe" in line)

    assert " never " in row()
    assert httpx.get(f"{api}/v1/runs", headers=bearer(key)).status_code == 200
    used = row()
    assert " never " not in used
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", used), used


def test_bad_key_commands_say_why(env: dict[str, str]) -> None:
    bad = recallq(env, "keys", "create", "--project", "no spaces", "--role", "admin")
    assert bad.returncode == 2 and "project must be" in bad.stderr and "Traceback" not in bad.stderr
    missing = recallq(env, "keys", "revoke", "0000000000000000")
    assert missing.returncode == 2 and "no active key" in missing.stderr


def test_the_cli_deletes_with_an_admin_key(
    api: str, env: dict[str, str], keys: dict[str, str | None]
) -> None:
    run = _run(api, keys["admin"], cancelled=True)
    as_writer = recallq({**env, "RECALLQ_API_KEY": str(keys["write"])}, "delete", run, "--api", api)
    assert as_writer.returncode == 2 and "403 forbidden" in as_writer.stderr  # as every refusal
    as_admin = recallq({**env, "RECALLQ_API_KEY": str(keys["admin"])}, "delete", run, "--api", api)
    assert as_admin.returncode == 0, as_admin.stderr
    assert httpx.get(f"{api}/v1/runs/{run}", headers=bearer(keys["admin"])).status_code == 404


def test_delete_refuses_a_run_that_is_not_ended(api: str, keys: dict[str, str | None]) -> None:
    run = _run(api, keys["admin"])
    response = httpx.delete(f"{api}/v1/runs/{run}", headers=bearer(keys["admin"]))
    assert error_of(response) == (409, "run_active")
    assert httpx.get(f"{api}/v1/runs/{run}", headers=bearer(keys["admin"])).status_code == 200


def test_a_missing_key_names_the_setting_the_cli_reads(api: str, env: dict[str, str]) -> None:
    response = httpx.get(f"{api}/v1/runs")
    assert error_of(response) == (401, "unauthenticated")
    assert "RECALLQ_API_KEY" in response.json()["error"]["message"]
    without_key = {k: v for k, v in env.items() if k != "RECALLQ_API_KEY"}
    listed = recallq(without_key, "runs", "--api", api)
    assert listed.returncode == 2 and "RECALLQ_API_KEY" in listed.stderr, listed.stderr
    assert "Traceback" not in listed.stderr
