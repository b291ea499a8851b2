"""`recallq rejudge`: a local run's claims attributed again by another judge, through litellm
to the stub, without one extraction call (the new run's `claims_from`, not the claim cache:
nothing is left for later runs); `agreement --against` compares the two judges."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from tests.launcher import run_recallq
from tests.services import REPO, write_models_file


def _recallq(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_recallq(args, cwd=cwd, env=env, timeout=300)


def test_rejudge_attributes_the_same_claims_with_another_model(
    tmp_path: Path, clean_stub: Any
) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("RECALLQ_")},
        "RECALLQ_DATABASE_URL": f"sqlite:///{tmp_path / 'rejudge.db'}",
        "RECALLQ_MODELS_FILE": str(write_models_file(tmp_path, clean_stub.base_url)),
        "STUB_API_KEY": "sk-stub-secret",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    done = _recallq(env, tmp_path, "run", str(REPO / "examples" / "eval_set.jsonl"), "--quiet")
    assert done.returncode == 0, done.stderr
    (source,) = json.loads(_recallq(env, tmp_path, "runs", "--json").stdout)

    again = _recallq(env, tmp_path, "rejudge", source["id"], "--model", "stub-judge", "--quiet")
    assert again.returncode == 0, again.stderr
    runs = json.loads(_recallq(env, tmp_path, "runs", "--json").stdout)
    (new,) = [run for run in runs if run["id"] != source["id"]]
    assert new["model"] == "stub-judge" and new["counts"]["succeeded"] == 24
    schemas = clean_stub.stats()["by_schema"]
    assert schemas.get("claim_attribution", 0) > 0
    assert not schemas.get("claim_extraction") and not schemas.get("claim_extraction_packed")

    shown = _recallq(env, tmp_path, "agreement", new["id"], "--against", source["id"], "--json")
    assert shown.returncode == 0, shown.stderr
    body = json.loads(shown.stdout)
    # every claim of the source's scored items is compared: the texts are the same
    assert body["labelled_claims"] == source["summary"]["claims_total"]
    assert body["flip_rate"] is not None and body["kappa"] is not None

    # the claims went to the new run only: a later run of the same judge extracts its own
    clean_stub.reset()
    later = _recallq(
        env, tmp_path, "run", str(REPO / "examples" / "eval_set.jsonl"), "--model", "stub-judge",
        "--fresh", "--quiet",
    )  # fmt: skip
    assert later.returncode == 0, later.stderr
    schemas = clean_stub.stats()["by_schema"]
    assert schemas.get("claim_extraction", 0) + schemas.get("claim_extraction_packed", 0) > 0

    unknown = _recallq(
        env, tmp_path, "run", str(REPO / "examples" / "eval_set.jsonl"), "--claims-from", "nope"
    )
    assert unknown.returncode == 2, unknown.stderr
    assert unknown.stderr.strip().splitlines() == ["recallq: claims_from: run 'nope' not found"]

    remote = _recallq({**env, "RECALLQ_API_URL": "http://127.0.0.1:9"}, tmp_path, "rejudge", "x")
    assert remote.returncode == 2 and "cannot reach the API" in remote.stderr


def test_evaluate_takes_claims_from_an_earlier_local_run(
    tmp_path: Path, clean_stub: Any, monkeypatch: Any
) -> None:
    """The first run's judge is the lexical one, the second the stub: every stub extraction
    call is an item that did not inherit its claims."""
    import recallq
    from recallq.runs.ingest import SubmissionError

    items: list[dict[str, Any]] = [
        {"id": f"q{i}", "ground_truth": f"Fact {i} holds. Fact {i} matters.", "context": ["x"]}
        for i in range(4)
    ]
    url = f"sqlite:///{tmp_path / 'evaluate.db'}"
    first = recallq.evaluate(items, progress=False, database_url=url)
    items[3]["ground_truth"] = "Something else entirely."  # extracted again, not inherited
    monkeypatch.setenv("RECALLQ_MODELS_FILE", str(write_models_file(tmp_path, clean_stub.base_url)))
    monkeypatch.setenv("STUB_API_KEY", "sk-stub-secret")
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    second = recallq.evaluate(
        items, "stub-judge", progress=False, database_url=url, claims_from=first.run_id
    )
    schemas = clean_stub.stats()["by_schema"]
    assert schemas.get("claim_extraction", 0) + schemas.get("claim_extraction_packed", 0) == 1
    assert schemas["claim_attribution"] == 4
    texts = {i["id"]: [c["text"] for c in i["claims"]] for i in first.items}
    again = {i["id"]: [c["text"] for c in i["claims"]] for i in second.items}
    assert {k: again[k] for k in ("q0", "q1", "q2")} == {k: texts[k] for k in ("q0", "q1", "q2")}
    assert again["q3"] != texts["q3"]
    try:
        recallq.evaluate(items, progress=False, database_url=url, claims_from="nope")
    except SubmissionError as exc:
        assert exc.message == "claims_from: run 'nope' not found"
    else:
        raise AssertionError("an unknown claims_from run was accepted")
