"""The command line's own refusals read as a person types them."""

from __future__ import annotations

import pytest

from recallq.cli.parser import build_parser
from recallq.labels import store as labels


def test_an_unknown_status_lists_the_statuses_as_typed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["runs", "--status", "bogus"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "(choose from 'queued', 'running', 'completed', 'cancelled')" in error
    assert "RunStatus" not in error
    assert build_parser().parse_args(["runs", "--status", "completed"]).status == "completed"


def test_a_sample_seed_has_the_apis_bound(capsys: pytest.CaptureFixture[str]) -> None:
    """One bound for a sample's seed (recallq.labels.store.MAX_SEED, 2**53 - 1: exact in any JSON
    client) in the CLI, the API's schema and the labelling page."""
    top = str(labels.MAX_SEED)
    parsed = build_parser().parse_args(["label", "r", "--sample", "3", "--seed", top, "--out", "x"])
    assert parsed.seed == labels.MAX_SEED
    for refused in (str(labels.MAX_SEED + 1), "9" * 5000, "-1", "1.5"):
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args(["label", "r", "--sample", "3", "--seed", refused])
        assert exited.value.code == 2
        assert f"must be a whole number from 0 to {top}" in capsys.readouterr().err


def test_worker_processes_and_threads_are_at_least_one(capsys: pytest.CaptureFixture[str]) -> None:
    parsed = build_parser().parse_args(["worker", "--processes", "3", "--concurrency", "4"])
    assert (parsed.processes, parsed.concurrency) == (3, 4)
    assert build_parser().parse_args(["worker"]).processes is None  # the CPUs it may use
    for option in ("--processes", "--concurrency"):
        for refused in ("0", "-2", "two"):
            with pytest.raises(SystemExit) as exited:
                build_parser().parse_args(["worker", option, refused])
            assert exited.value.code == 2
            assert f"argument {option}:" in capsys.readouterr().err
