"""The README's commands, followed literally by a newcomer: the local run, the Python snippet
and the service quickstart each work as written.

The blocks are read from README.md itself, so an edit that breaks one fails here. What the
test changes is only what must differ on a shared machine, each on its own line below: the
`pip install` lines are left out (this environment has the package installed), the quickstart's
database gets a throwaway name on the test Postgres, its Redis is a redis-server of the test's
own, and port 8000 is a free port. The LLM example needs a provider key and a network, so it is
checked for naming files that exist instead of being run.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
import yaml

from tests.services import PG_ADMIN_URL, REPO, RedisServer, free_port

README = (REPO / "README.md").read_text()


def _section(title: str) -> str:
    found = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.M | re.S)
    assert found, f"README has no section {title!r}"
    return found.group(1)


def _blocks(title: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", _section(title), re.M | re.S)


def _without_pip(block: str) -> str:
    return "\n".join(line for line in block.splitlines() if not line.startswith("pip install"))


def _workdir(tmp_path: Path) -> Path:
    """A fresh directory where the README's relative paths (examples/...) resolve."""
    (tmp_path / "examples").symlink_to(REPO / "examples")
    return tmp_path


def _env() -> dict[str, str]:
    """A newcomer's environment: none of recallq's settings set."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RECALLQ_")}


def test_the_first_command_and_the_local_run_work_as_written(tmp_path: Path) -> None:
    first = README.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()[0]
    assert first.startswith("pip install -e . && recallq run examples/eval_set.jsonl")
    script = "\n".join(
        [first.split("&&", 1)[1].split("#", 1)[0], _without_pip(_blocks("Score a file", "bash")[0])]
    )
    cwd = _workdir(tmp_path)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "mean_score" in done.stdout
    assert len((cwd / "results.jsonl").read_text().splitlines()) == 24


def test_the_llm_example_names_files_that_exist() -> None:
    block = _blocks("Score a file", "bash")[1]
    models_file = re.search(r"RECALLQ_MODELS_FILE=\$PWD/(\S+)", block)
    assert models_file, block
    models = yaml.safe_load((REPO / models_file.group(1)).read_text())["models"]
    named = set(re.findall(r"--model (\S+)", block))
    assert named and named <= {model["name"] for model in models}


def test_the_python_snippet_works_as_written(tmp_path: Path) -> None:
    code = _blocks("From Python", "python")[0]
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            code + "\nprint(len(result.to_pandas()), result.summary['mean_score'])",
        ],
        cwd=_workdir(tmp_path),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if "No module named 'pandas'" in done.stderr:
        pytest.skip("pandas is not installed (the parquet extra)")
    assert done.returncode == 0, done.stderr
    count, mean = done.stdout.split()[-2:]
    assert int(count) == 24 and 0 < float(mean) <= 1


def test_the_service_quickstart_works_as_written(tmp_path: Path) -> None:
    database = f"recallq_readme_{uuid.uuid4().hex[:8]}"
    redis = RedisServer().start()
    port = free_port()
    script = _without_pip(_blocks("Run the service", "bash")[0])
    # only what must differ on a shared machine (see the module docstring)
    script = script.replace("@127.0.0.1/recallq", f"@127.0.0.1/{database}")
    script = script.replace("-U postgres recallq", f"-U postgres {database}")
    script = script.replace("redis://127.0.0.1:6379/0", redis.url())
    script = script.replace("8000", str(port))
    assert database in script and redis.url() in script and str(port) in script
    out_file, err_file = tmp_path / "stdout", tmp_path / "stderr"
    with out_file.open("w") as out, err_file.open("w") as err:
        # files, not pipes: the API and the worker in the background keep them open
        process = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=_workdir(tmp_path),
            env=_env(),
            stdout=out,
            stderr=err,
            text=True,
            start_new_session=True,  # the API and the worker it starts die with its group
        )
    try:
        process.wait(timeout=300)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        redis.stop()
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    stdout, stderr = out_file.read_text(), err_file.read_text()
    assert process.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr
    assert "completed" in stdout
    assert "No runs" not in stdout
