"""A run's static context is stored once, on the run: a 1 MB static context with 200 tiny
items grows the database by about a megabyte (it grew by 209 MB when every item copied it).
Against a real API (keys required) and Postgres."""

from __future__ import annotations

import random
from collections.abc import Iterator

import psycopg
import pytest

from tests.integration.secured import make_key, secured_env, submit
from tests.services import start_api


@pytest.fixture(scope="module")
def env(service_env: dict[str, str]) -> dict[str, str]:
    return secured_env(service_env, submissions_per_minute=0, max_active_runs_per_project=1000)


@pytest.fixture(scope="module")
def served(env: dict[str, str]) -> Iterator[tuple[str, str]]:
    key = make_key(env, "static", "write")
    process, url = start_api(env)
    yield url, key
    process.stop()


def _size(env: dict[str, str]) -> int:
    url = env["RECALLQ_DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM items")  # settle free space, so growth is what was written
        row = conn.execute(
            "SELECT pg_total_relation_size('items') + pg_total_relation_size('runs')"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_megabyte_of_static_context_is_stored_once(served, env: dict[str, str]) -> None:
    url, key = served
    words = [f"word{n}" for n in range(5000)]
    rng = random.Random(7)
    passages = [" ".join(rng.choice(words) for _ in range(250)) for _ in range(600)]
    context: list[str] = []
    while sum(len(p) + 1 for p in context) < 1_000_000:
        context.append(passages[len(context) % len(passages)] + f" {len(context)}")
    items = [{"id": f"i{i}", "ground_truth": f"Word{i} appears."} for i in range(200)]
    before = _size(env)
    response = submit(url, key, {"items": items, "context": context})
    assert response.status_code == 202, response.text[:300]
    assert response.json()["counts"]["total"] == 200
    growth = _size(env) - before
    size = sum(map(len, context)) / 1e6
    print(f"database growth: {growth / 1e6:.2f} MB for a {size:.2f} MB context")
    assert growth < 3_000_000


def test_a_static_context_over_the_limit_is_a_422(served) -> None:
    url, key = served
    context = ["x" * 600_000, "y" * 600_000]  # 1.2 MB: past the 1 MiB limit
    response = submit(url, key, {"items": [{"id": "a", "ground_truth": "x"}], "context": context})
    assert response.status_code == 422
    assert "static context" in response.json()["error"]["message"]
    many = ["p"] * 1001
    response = submit(url, key, {"items": [{"id": "a", "ground_truth": "x"}], "context": many})
    assert response.status_code == 422 and "1001 passages" in response.json()["error"]["message"]


def test_an_item_context_over_the_limit_names_the_item(served) -> None:
    url, key = served
    items = [{"id": "ok", "context": ["fine"]}, {"id": "heavy", "context": ["z"] * 1001}]
    response = submit(url, key, {"items": items})
    assert response.status_code == 422
    message = response.json()["error"]["message"]
    assert "item 1 (heavy)" in message and "at most 1000" in message
