from __future__ import annotations

import os
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

TESTS = Path(__file__).resolve().parent
#: What starts a process from a test: the API, Celery workers, chromium, the CLI.
_STARTS_A_PROCESS = re.compile(
    r"\b(start_api|start_worker|run_recallq|recallq_process|subprocess|Popen|chromium)\b"
)
_TEST_IMPORT = re.compile(r"^from tests\.([\w.]+) import", re.MULTILINE)
#: The shared helpers: they define how processes start, and start none by being imported.
_LIBRARIES = {TESTS / name for name in ("services.py", "launcher.py", "stub_llm.py", "fakes.py")}


@cache
def _starts_processes(module: Path) -> bool:
    """Whether a test module starts processes: itself, a conftest.py above it, or a test
    module or helper it imports from (the shared libraries aside)."""
    if module in _LIBRARIES or not module.is_file():
        return False
    source = module.read_text()
    conftests = [d / "conftest.py" for d in module.parents if d != TESTS and TESTS in d.parents]
    imported = [
        TESTS.joinpath(*name.split(".")).with_suffix(".py") for name in _TEST_IMPORT.findall(source)
    ]
    return bool(_STARTS_A_PROCESS.search(source)) or any(
        _starts_processes(path) for path in (*conftests, *imported) if path != module
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The fast tier is `python -m pytest -m "not slow"`: the tests that start no process
    (unit tests, and integration tests in-process against real Postgres, Redis and the stub
    LLM server). Tests of a module that starts processes are slow, marked here, besides those
    marked by hand (fault injection, provider incidents)."""
    for item in items:
        if _starts_processes(item.path):
            item.add_marker(pytest.mark.slow)


def pytest_collection_finish(session: pytest.Session) -> None:
    """When tests that start recallq's processes are to run, the launcher that forks them
    (tests/launcher.py) starts importing now, alongside the tests that come first."""
    from tests import launcher

    if session.config.option.collectonly or launcher.SPAWN:
        return
    if any(item.get_closest_marker("slow") for item in session.items):
        launcher.launcher()


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A migrated throwaway Postgres database for the test session."""
    from tests.services import migrated_database

    with migrated_database() as url:
        yield url


@pytest.fixture(scope="session")
def stub() -> Iterator:
    from tests.stub_llm import StubServer

    with StubServer() as server:
        yield server


@pytest.fixture()
def clean_stub(stub):
    """The stub with no recorded calls and every setting at its default: no faults, no
    hostile or flipping judge, prompts recorded (a test that changed one must not leak it)."""
    from tests.stub_llm import StubConfig

    stub.reset()
    stub.configure(**StubConfig().as_dict())
    return stub


@pytest.fixture(scope="module")
def service_env(pg_database: str, stub, tmp_path_factory) -> dict[str, str]:
    """Environment for recallq processes: Postgres, a clean Redis database, the stub model.
    Without keys (RECALLQ_AUTH=off) and without limits per client: the tests of those
    (tests/integration/test_security.py and its neighbours) start an API of their own."""
    from tests.services import redis_database, write_models_file

    tmp_path: Path = tmp_path_factory.mktemp("env")
    return {
        **os.environ,
        "RECALLQ_DATABASE_URL": pg_database,
        "RECALLQ_REDIS_URL": redis_database(11),
        "RECALLQ_MODELS_FILE": str(write_models_file(tmp_path, stub.base_url)),
        "STUB_API_KEY": "sk-stub-secret",
        "RECALLQ_RETRY_BASE_DELAY": "0.05",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "RECALLQ_AUTH": "off",
        "RECALLQ_SUBMISSIONS_PER_MINUTE": "0",
        "RECALLQ_MAX_ACTIVE_RUNS_PER_PROJECT": "100000",
    }
