from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


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
    """The stub with no recorded calls and no faults."""
    stub.reset()
    stub.configure(latency_ms=0, rate_429=0, rate_500=0, rpm_limit=None)
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
