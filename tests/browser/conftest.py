"""A real stack for the browser tests, and Debian's chromium driven by Playwright.

The stack: the session's Postgres test database, a Redis database of the session's own
redis-server, the API with keys required, one Celery worker and the stub LLM as the judge, so
runs are scored for real. Keys for two projects are made as `recallq keys create` makes them. The
runs every test reads are submitted and scored once here; tests that change a run (cancel,
retry) submit their own.

Screenshots of every page a test looks at go to a temporary directory (printed at the end of
the session); with RECALLQ_SCREENSHOTS=DIR the README's two (run page and item page, the
viewport only) are also written there, e.g. RECALLQ_SCREENSHOTS=docs.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser import evalsets
from tests.integration.secured import bearer, make_key, secured_env, submit
from tests.services import REPO, Process, redis_database, start_api, start_worker

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1200, "height": 800}
MODEL = "stub-judge"
ITEMS = 24
FAILING = (22, 23)  # items of retriever A the judge refuses (a permanent provider error)


@dataclass
class Stack:
    url: str
    env: dict[str, str]  # for `recallq` commands against the API: RECALLQ_API_URL, _API_KEY
    keys: dict[str, str]  # alpha_write, alpha_read, beta_write
    runs: dict[str, str]  # retriever_a, retriever_b (alpha's, scored)
    stub: Any
    processes: list[Process]  # the API and the worker

    def logs(self) -> str:
        """Everything the API and the worker have logged so far."""
        return "\n".join(process.output() for process in self.processes)

    def get(self, path: str, key: str | None = None, **params: Any) -> dict[str, Any]:
        """GET /v1... with alpha's write key unless told; the JSON body of a 200."""
        response = httpx.get(
            f"{self.url}{path}",
            headers=bearer(key or self.keys["alpha_write"]),
            params=params,
            timeout=60,
        )
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def submit(self, items: list[dict[str, Any]], name: str, key: str | None = None) -> str:
        body = {"name": name, "model": MODEL, "items": items}
        response = submit(self.url, key or self.keys["alpha_write"], body)
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    def wait(self, run_id: str, timeout: float = 120) -> dict[str, Any]:
        """The run once it has ended."""
        deadline = time.monotonic() + timeout
        while True:
            run = self.get(f"/v1/runs/{run_id}")
            if run["status"] in ("completed", "cancelled", "failed"):
                return run
            assert time.monotonic() < deadline, f"run {run_id} did not end: {run}"
            time.sleep(0.2)

    def cli_env(self, key: str | None = None) -> dict[str, str]:
        return {
            **self.env,
            "RECALLQ_API_URL": self.url,
            "RECALLQ_API_KEY": key or self.keys["alpha_write"],
        }


@pytest.fixture(scope="package")
def browser_database() -> Iterator[str]:
    """The stack's database, for every browser test (tests/conftest.py's is per module)."""
    from tests.services import migrated_database

    with migrated_database() as url:
        yield url


@pytest.fixture(scope="package")
def stack(browser, browser_database: str, stub, tmp_path_factory) -> Iterator[Stack]:
    """The stack, started once the browser is known to be there (else every test skips)."""
    from tests.services import write_models_file

    stub.reset()
    stub.configure(latency_ms=0, rate_429=0, rate_500=0, rpm_limit=None, reject_keys=[])
    directory: Path = tmp_path_factory.mktemp("browser-env")
    env = secured_env(
        {
            **os.environ,
            "RECALLQ_DATABASE_URL": browser_database,
            "RECALLQ_REDIS_URL": redis_database(10),
            "RECALLQ_MODELS_FILE": str(write_models_file(directory, stub.base_url)),
            "STUB_API_KEY": "sk-stub-secret",
            "RECALLQ_RETRY_BASE_DELAY": "0.05",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        },
        submissions_per_minute=0,
        max_active_runs_per_project=1000,
    )
    keys = {
        "alpha_write": make_key(env, "alpha", "write", label="browser alpha write"),
        "alpha_read": make_key(env, "alpha", "read", label="browser alpha read"),
        "beta_write": make_key(env, "beta", "write", label="browser beta write"),
    }
    worker = start_worker(env, concurrency=4)
    api, url = start_api(env)
    made = Stack(url=url, env=env, keys=keys, runs={}, stub=stub, processes=[api, worker])
    try:
        made.runs["retriever_a"] = made.submit(
            evalsets.retriever_a(ITEMS, failing=FAILING), "retriever-a"
        )
        made.runs["retriever_b"] = made.submit(evalsets.retriever_b(ITEMS), "retriever-b")
        for run_id in made.runs.values():
            assert made.wait(run_id)["status"] == "completed"
        yield made
    finally:
        api.stop()
        worker.stop()


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: `apt-get install chromium` (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture()
def context(browser) -> Iterator[Any]:
    """A fresh browser context (no cookies): one user's browser."""
    made = browser.new_context(viewport=VIEWPORT, device_scale_factor=1)
    made.set_default_timeout(10_000)  # a page answers in milliseconds; fail fast when not
    yield made
    made.close()


def sign_in(context: Any, url: str, key: str) -> Any:
    """Signs in through the sign-in page as a user does; the page, on the runs page."""
    page = context.new_page()
    page.goto(f"{url}/signin")
    page.fill("input[name=key]", key)
    with page.expect_navigation():
        page.press("input[name=key]", "Enter")
    return page


@pytest.fixture(scope="package")
def screenshots(tmp_path_factory) -> Iterator[Path]:
    directory: Path = tmp_path_factory.mktemp("screenshots")
    yield directory
    print(f"\nbrowser screenshots: {directory}")


def shoot(page: Any, directory: Path, name: str, readme: bool = False) -> Path:
    """A full-page screenshot into `directory`; a README one (the viewport only) also into
    RECALLQ_SCREENSHOTS when that is set."""
    path = directory / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    target = os.environ.get("RECALLQ_SCREENSHOTS")
    if readme and target:
        out = REPO / target / f"{name}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out), full_page=False)  # 1200x800: about 100-130 KB
    return path


SECRET = re.compile(r"rq_[A-Za-z0-9_-]{43}")
