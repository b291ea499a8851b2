from __future__ import annotations

import fcntl
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

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


#: Modules that assert on real time (outages and probes, leases, rates, stalls, how soon
#: something answers): under pytest-xdist they are one group, run one after another on one
#: worker, so two of them never share the machine's two cores.
TIMING_SENSITIVE = {
    "integration/test_faults.py",
    "integration/test_incidents.py",
    "integration/test_outage_recovery.py",
    "integration/test_lost_work_faults.py",
    "integration/test_prometheus.py",
    "integration/test_slow_clients.py",
    "integration/test_stream_cap_probe.py",
    "integration/test_limits.py",
    "integration/test_extraction_budget.py",
    "integration/test_ratelimit_and_gate.py",
}
#: Groups that start first, longest first (tests/README.md has their minutes): one of them
#: started last would leave the other worker idle at the end.
FIRST = (
    "timing-sensitive",
    "integration/test_batch_mode.py",
    "integration/test_openapi.py",
    "integration/test_claims_from.py",
    "browser",
    "e2e/test_readme.py",
)


def _group(path: str) -> str:
    """The xdist group of the tests of a module (a path under tests/): the module's own
    (module-scoped services start once), the timing-sensitive one, or the browser
    package's (one stack and one chromium)."""
    if path in TIMING_SENSITIVE:
        return "timing-sensitive"
    return "browser" if path.startswith("browser/") else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadscope`, with _group as the scope: a group's tests go to one worker, and
    the groups are handed out in the order of the collection (pytest_collection_modifyitems
    puts them in order; --no-loadscope-reorder keeps it). xdist's own `loadgroup` reads
    marks through node ids that pytest 9.2 no longer lets it change (pytest-xdist #1386)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid.split("::", 1)[0].removeprefix("tests/"))

    return ByGroup(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The fast tier is `python -m pytest -m "not slow"`: the tests that start no process
    (unit tests, and integration tests in-process against real Postgres, Redis and the stub
    LLM server). Tests of a module that starts processes are slow, marked here, besides those
    marked by hand (fault injection, provider incidents).

    In an xdist worker the tests are put in the order their groups are handed out: FIRST,
    then the slow ones, then the fast ones."""
    for item in items:
        if _starts_processes(item.path):
            item.add_marker(pytest.mark.slow)
    if hasattr(config, "workerinput"):

        def rank(item: pytest.Item) -> int:
            group = _group(item.path.relative_to(TESTS).as_posix())
            if group in FIRST:
                return FIRST.index(group)
            return len(FIRST) + (0 if item.get_closest_marker("slow") else 1)

        items.sort(key=rank)  # stable: each group keeps its tests' order


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """Under xdist, a test marked `alone` (its assertions allow a few milliseconds of
    scheduling delay) runs while no other worker runs a test: it holds the run's lock file
    exclusively, every other test shares it. Setup and teardown included."""
    config = item.config
    if not hasattr(config, "workerinput"):
        return (yield)
    alone = item.get_closest_marker("alone") is not None
    with _run_lock(config.workerinput["testrunuid"], exclusive=alone):
        return (yield)


@contextmanager
def _run_lock(run: str, exclusive: bool) -> Iterator[None]:
    """A readers-writer lock of the run's xdist workers, writers first: the gate, held by a
    writer while it waits and runs, keeps new readers out until it is done."""
    base = Path(tempfile.gettempdir()) / f"recallq-tests-{run}"
    with open(f"{base}.gate", "a") as gate, open(f"{base}.lock", "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


def pytest_collection_finish(session: pytest.Session) -> None:
    """When tests that start recallq's processes are to run, the launcher that forks them
    (tests/launcher.py) starts importing now, alongside the tests that come first. Not in an
    xdist worker, which collects every test and runs some: there it starts when first used,
    within a test (so a test running `alone` on the other worker is not disturbed by it)."""
    from tests import launcher

    config = session.config
    if config.option.collectonly or launcher.SPAWN or hasattr(config, "workerinput"):
        return
    if any(item.get_closest_marker("slow") for item in session.items):
        launcher.launcher()


@pytest.fixture(scope="module")
def pg_database() -> Iterator[str]:
    """A migrated throwaway Postgres database of the test module's own (migrating takes under
    a second). Not one for the session: a worker's reaper sends every active run of its
    database again, so each module's workers would score the runs earlier modules left
    queued (an API without a worker, a fuzzer's submissions), for minutes of the session."""
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
