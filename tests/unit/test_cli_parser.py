"""The command line's own refusals read as a person types them."""

from __future__ import annotations

import pytest

from recallq.cli.parser import build_parser


def test_an_unknown_status_lists_the_statuses_as_typed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["runs", "--status", "bogus"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "(choose from 'queued', 'running', 'completed', 'cancelled')" in error
    assert "RunStatus" not in error
    assert build_parser().parse_args(["runs", "--status", "completed"]).status == "completed"
