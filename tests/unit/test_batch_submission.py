"""A batch-mode run at submission: the models file's `batch: true` and `batch_discount`, the
run's `mode`, and how the API shows items the batch lane owns."""

from __future__ import annotations

from pathlib import Path

import pytest

from recallq.core.status import ItemStatus, public_item_status, stored_item_statuses
from recallq.judge.models import JudgeModelsError, batch_models, load_models
from recallq.runs import ingest
from recallq.state.tables import Run, RunMode

MODELS = """\
models:
  - name: cheap
    litellm_params: {model: openai/gpt-4o-mini}
    batch: true
    batch_discount: 0.4
  - name: live-only
    litellm_params: {model: openai/gpt-4o}
"""


def models_file(tmp_path: Path, text: str = MODELS) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return path


def test_the_models_file_marks_which_models_may_batch(tmp_path: Path) -> None:
    models = load_models(models_file(tmp_path))
    assert models["cheap"].batch and models["cheap"].batch_discount == 0.4
    assert not models["live-only"].batch and models["live-only"].batch_discount is None
    assert batch_models(models) == ["cheap"]


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("batch: yes-please", "batch must be true or false"),
        ("batch_discount: 1.5", "batch_discount must be a number from 0 to 1"),
        ("batch_discount: true", "batch_discount must be a number from 0 to 1"),
    ],
)
def test_bad_batch_fields_are_refused(tmp_path: Path, field: str, message: str) -> None:
    text = f"models:\n  - name: m\n    litellm_params: {{model: openai/x}}\n    {field}\n"
    with pytest.raises(JudgeModelsError, match=message):
        load_models(models_file(tmp_path, text))


def spec(mode: object, model: str = "cheap") -> ingest.RunSpec:
    return ingest.build_spec(
        model=model, known_models=["cheap", "live-only"], mode=mode, batch_models=["cheap"]
    )


def test_a_run_is_online_unless_it_asks_for_batch() -> None:
    assert spec(None).mode == RunMode.ONLINE
    assert spec("online", "live-only").mode == RunMode.ONLINE
    assert spec("batch").mode == RunMode.BATCH


def test_batch_mode_needs_a_model_marked_batch() -> None:
    with pytest.raises(ingest.SubmissionError) as refused:
        spec("batch", "live-only")
    assert refused.value.code == "batch_not_supported" and refused.value.status == 422
    assert "'live-only'" in refused.value.message and "cheap" in refused.value.message
    with pytest.raises(ingest.SubmissionError, match='mode must be "online" or "batch"'):
        spec("offline")


def test_a_retried_submission_in_another_mode_is_another_submission() -> None:
    run = Run(
        model="cheap",
        name=None,
        scale=1.0,
        context=None,
        context_extractor=None,
        retry_deadline_s=spec("batch").retry_deadline_s,
        mode=RunMode.BATCH,
        total_items=1,
    )
    ingest.check_same_submission(run, spec("batch"), [{}])
    with pytest.raises(ingest.SubmissionError, match="its mode differ"):
        ingest.check_same_submission(run, spec("online"), [{}])


def test_an_item_in_the_batch_lane_shows_as_running() -> None:
    assert public_item_status(ItemStatus.BATCHED) == "running"
    assert stored_item_statuses("running") == (ItemStatus.RUNNING, ItemStatus.BATCHED)
    assert stored_item_statuses("pending") == (ItemStatus.PENDING, ItemStatus.QUEUED)
