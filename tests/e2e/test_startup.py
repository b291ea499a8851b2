"""Issue 25, as users run the command: what each command imports, the LLM judge's client loaded
while the first progress line shows, and the README's first command on a fresh clone with
`pip install -e .` alone (no extra).

How fast is the benchmark's (`python -m bench --sections startup`, docs/benchmarks.md); these
tests fail when a heavy library comes back on a path that does not use it."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

from recallq.runs.local import LOADING_JUDGE_CLIENT
from tests.services import REPO, free_port, write_models_file

EXAMPLE = REPO / "examples" / "eval_set.jsonl"
RECALLQ_SCRIPT = Path(sys.executable).with_name("recallq")
#: The service's and the LLM judges' libraries, and the migration tool: none of them is for
#: --help, listing or showing local runs, or the offline first command.
SERVICE = {"uvicorn", "fastapi", "starlette", "celery", "kombu", "redis", "psycopg"}
LLM = {"litellm", "openai"}
HEAVY = SERVICE | LLM | {"alembic"}
PROGRESS = re.compile(r"^\w+: \d+ scored, \d+ failed, \d+ to go")

# the command in a fresh interpreter, then the top-level modules it imported
_PROBE = """
import json, sys
from recallq.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
loaded = sorted({name.split(".")[0] for name in sys.modules})
print(json.dumps({"code": code, "modules": loaded}), file=sys.__stdout__)
"""


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A newcomer's environment: none of recallq's settings."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RECALLQ_")}
    return base | (extra or {})


def _imports(*args: str, cwd: Path) -> tuple[int, set[str]]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    probe = json.loads(done.stdout.splitlines()[-1])
    return probe["code"], set(probe["modules"])


def test_help_imports_the_parser_alone(tmp_path: Path) -> None:
    code, modules = _imports("--help", cwd=tmp_path)
    assert code == 0
    light = {"sqlalchemy", "pydantic", "httpx", "yaml", "jinja2", "tqdm"}
    assert modules & (HEAVY | light) == set()


def test_the_first_command_and_the_local_client_commands_import_no_server_nor_llm_client(
    tmp_path: Path,
) -> None:
    code, first = _imports("run", str(EXAMPLE), "--quiet", cwd=tmp_path)
    assert code == 0
    assert first & (SERVICE | LLM | {"httpx"}) == set()  # a new database: alembic makes it
    (run_id,) = [row[0] for row in sqlite3.connect(tmp_path / "recallq.db").execute(
        "SELECT id FROM runs")]  # fmt: skip
    for command in (["runs"], ["status", run_id], ["run", str(EXAMPLE), "--quiet"]):
        code, modules = _imports(*command, cwd=tmp_path)
        assert code == 0, command
        # the database is at this recallq's schema already: nothing to migrate, no alembic
        assert modules & (HEAVY | {"httpx"}) == set(), command


def _llm_env(tmp_path: Path, stub: Any, transport: str = "litellm", **extra: str) -> dict[str, str]:
    """A local run's environment with the stub's model, on the litellm lane unless told."""
    models = write_models_file(tmp_path, stub.base_url, transport=transport)
    return _env(
        {
            "RECALLQ_DATABASE_URL": f"sqlite:///{tmp_path / 'local.db'}",
            "RECALLQ_MODELS_FILE": str(models),
            "STUB_API_KEY": "sk-stub-secret",
            **extra,
        }
    )


def _items(tmp_path: Path, count: int) -> Path:
    path = tmp_path / "items.jsonl"
    truths = [f"Depot {n} opened in {1990 + n}. Depot {n} has {n + 3} docks." for n in range(count)]
    path.write_text("".join(json.dumps({"ground_truth": t, "context": [t]}) + "\n" for t in truths))
    return path


def test_the_first_progress_line_shows_while_the_llm_client_loads(
    tmp_path: Path, clean_stub
) -> None:
    """The run is read, checked and stored, and says so, before litellm (seconds of CPU) is
    imported; no item goes to the judge before it is (recallq.runs.local.JudgeClientLoad)."""
    done = subprocess.run(
        [str(RECALLQ_SCRIPT), "run", str(_items(tmp_path, 3)), "--model", "stub-judge"],
        cwd=tmp_path,
        env=_llm_env(tmp_path, clean_stub),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    progress = [line for line in done.stderr.splitlines() if PROGRESS.match(line)]
    assert progress[0].endswith(f": 0 scored, 0 failed, 3 to go; {LOADING_JUDGE_CLIENT}")
    assert progress[-1] == "completed: 3 scored, 0 failed, 0 to go", done.stderr
    assert len(clean_stub.calls()) >= 2  # extraction, then attribution


def test_a_judge_client_that_fails_to_load_is_one_line(tmp_path: Path, clean_stub) -> None:
    """A litellm that cannot be imported (a broken install) fails the command with one line, as
    an import in the command's own thread would: the load's error is raised where it waits."""
    broken = tmp_path / "site" / "litellm"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise RuntimeError("this litellm is broken")\n')
    done = subprocess.run(
        [str(RECALLQ_SCRIPT), "run", str(_items(tmp_path, 2)), "--model", "stub-judge"],
        cwd=tmp_path,
        env=_llm_env(tmp_path, clean_stub, PYTHONPATH=str(broken.parent)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("recallq: ")]
    assert errors == [
        "recallq: unexpected error: RuntimeError: this litellm is broken (--debug shows where)"
    ], done.stderr
    assert "Traceback" not in done.stderr
    assert clean_stub.calls() == []


def test_a_run_whose_model_takes_the_direct_lane_never_imports_litellm(
    tmp_path: Path, clean_stub
) -> None:
    """Issue 29: an OpenAI-compatible model's calls go over the direct lane; the run scores
    its items with neither litellm nor the OpenAI SDK in the process (the same run on the
    litellm lane imports both: the probe can tell)."""
    items = str(_items(tmp_path, 3))
    for transport, imported in (("auto", set()), ("litellm", LLM)):
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, "run", items, "--model", "stub-judge", "--quiet"],
            cwd=tmp_path,
            env=_llm_env(tmp_path, clean_stub, transport),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        probe = json.loads(done.stdout.splitlines()[-1])
        assert probe["code"] == 0, done.stderr
        assert set(probe["modules"]) & LLM == imported, transport
        assert len(clean_stub.calls()) >= 2  # extraction, then attribution: really called
        clean_stub.reset()
        (tmp_path / "local.db").unlink()


_WORKER_PROBE = """
import json, sys
from recallq.settings import Settings
from worker import celery_app
celery_app.prepare(Settings())
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})), file=sys.__stdout__)
"""


def test_a_worker_whose_models_take_the_direct_lane_never_imports_litellm(tmp_path: Path) -> None:
    """What a worker imports before it forks its processes: litellm (patched) only when a
    model takes its lane or may use the Batch API (the batch lane speaks litellm)."""
    base = "http://127.0.0.1:1/v1"
    for extra, imported in (({}, set()), ({"transport": "litellm"}, LLM), ({"batch": "true"}, LLM)):
        models = write_models_file(tmp_path, base, **extra)
        done = subprocess.run(
            [sys.executable, "-c", _WORKER_PROBE],
            cwd=REPO,
            env=_env({"RECALLQ_MODELS_FILE": str(models), "STUB_API_KEY": "sk-x"}),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        assert set(json.loads(done.stdout.splitlines()[-1])) & LLM == imported, extra


def _fresh_clone(tmp_path: Path) -> Path:
    """The repository's files as a clone has them (tracked, and new ones not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    clone = tmp_path / "recallq"
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, clone / name)
    return clone


def test_the_first_command_works_on_a_fresh_clone_with_the_core_install_alone(
    tmp_path: Path,
) -> None:
    """The README's first line as written, in a new venv: `pip install -e .` brings neither
    litellm nor the service, the offline run works, and a command that needs an extra says
    which one, in one line."""
    first = (REPO / "README.md").read_text().split("```bash\n", 1)[1].splitlines()[0]
    command = first.split("#", 1)[0].strip()
    assert command == "pip install -e . && recallq run examples/eval_set.jsonl"
    clone = _fresh_clone(tmp_path)
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=True)
    env = _env({"PATH": f"{environment / 'bin'}{os.pathsep}{os.environ['PATH']}"})
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)

    def shell(line: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", line],
            cwd=clone,
            env=env | extra,
            capture_output=True,
            text=True,
            timeout=900,
        )

    done = shell(command)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "mean_score" in done.stdout and "Traceback" not in done.stderr
    installed = {
        line.split("==")[0].lower() for line in shell("pip list --format=freeze").stdout.split()
    }
    assert "recallq" in installed and not installed & (SERVICE | LLM | {"psycopg-binary"})

    hints = {
        # an OpenAI model takes the direct lane, which needs no extra; Anthropic's is litellm's
        "recallq run examples/eval_set.jsonl --model claude-3-5-haiku": "llm",
        "recallq worker": "service",
        f"recallq api --port {free_port()}": "service",
    }
    for line, extra in hints.items():
        done = shell(
            line,
            RECALLQ_MODELS_FILE="examples/models.yaml",
            OPENAI_API_KEY="sk-test",
            ANTHROPIC_API_KEY="sk-test",
        )
        assert done.returncode == 2, (line, done.stderr)
        said = done.stderr.strip().splitlines()
        assert len(said) == 1 and said[0].startswith("recallq: "), (line, done.stderr)
        assert f'pip install "recallq[{extra}]"' in said[0], (line, said)
