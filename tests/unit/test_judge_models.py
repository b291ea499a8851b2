"""Models file entries: `os.environ/NAME` values resolve from the environment, by name."""

from __future__ import annotations

import pytest

from recallq.judge.models import JudgeModelsError, ModelConfig


def _config() -> ModelConfig:
    return ModelConfig(
        "judge", {"model": "openai/x", "api_key": "os.environ/JUDGE_KEY", "api_base": "http://h"}
    )


def test_a_set_variable_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUDGE_KEY", "sk-123")
    params = _config().resolved_params()
    assert params == {"model": "openai/x", "api_key": "sk-123", "api_base": "http://h"}


def test_a_set_but_empty_variable_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUDGE_KEY", "")  # keyless local servers
    assert _config().resolved_params()["api_key"] == ""


def test_an_unset_variable_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JUDGE_KEY", raising=False)
    with pytest.raises(
        JudgeModelsError, match=r"'judge': JUDGE_KEY \(for litellm_params.api_key\) is not set"
    ):
        _config().resolved_params()
