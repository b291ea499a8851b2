"""Labels against a judge of known error: local runs (SQLite, `recallq` subprocesses) through
litellm to the stub with its flip mode, whose rule (tests.stub_llm.attribute) is the truth.

- 2,000 items, 20% of verdicts flipped, 200 items labelled from the rule: kappa and the
  confusion matrix match the flip rate within their intervals, the corrected interval covers
  the true mean while the judge-only interval misses it;
- no flips: kappa 1, no correction;
- the same judge twice: per-call flips differ at 2p(1-p), deterministic ones not at all.
"""

from __future__ import annotations

import csv
import json
import math
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.launcher import run_recallq
from tests.services import write_models_file
from tests.stub_llm import attribute, split_claims

FLIP = 0.2
pytestmark = pytest.mark.slow


def _items(n: int, seed: int) -> list[dict[str, Any]]:
    """Items of 2 to 4 claims each, supported at a rate of the item's own (claims cluster)."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        support = rng.betavariate(3, 1.5)
        claims = [f"Station w{i}n{k} measured q{i}z{k}" for k in range(rng.randint(2, 4))]
        passage = " ".join(
            f"station measured w{i}n{k} q{i}z{k}"
            for k in range(len(claims))
            if rng.random() < support
        )
        items.append(
            {
                "id": f"s{i}",
                "ground_truth": ". ".join(claims) + ".",
                "context": ["Station logbook entry.", passage or "Nothing measured today."],
                "region": "north" if i % 2 else "south",
            }
        )
    return items


def _truth(item: dict[str, Any]) -> dict[int, str]:
    claims = list(enumerate(split_claims(item["ground_truth"])))
    contexts = list(enumerate(item["context"]))
    return {v["claim_index"]: v["verdict"] for v in attribute(claims, contexts)}


@pytest.fixture(scope="module")
def flipping_stub() -> Iterator[Any]:
    """A stub of this module's own: its flip settings never reach another test's stub."""
    from tests.stub_llm import StubServer

    with StubServer() as server:
        yield server


@pytest.fixture()
def env(tmp_path: Path, flipping_stub: Any) -> dict[str, str]:
    flipping_stub.reset()
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("RECALLQ_")},
        "RECALLQ_DATABASE_URL": f"sqlite:///{tmp_path / 'labels.db'}",
        "RECALLQ_MODELS_FILE": str(write_models_file(tmp_path, flipping_stub.base_url)),
        "STUB_API_KEY": "sk-stub-secret",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }


def _recallq(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_recallq(args, cwd=cwd, env=env, timeout=900)


def _scored(env: dict[str, str], cwd: Path, items: list[dict[str, Any]], name: str) -> str:
    path = cwd / f"{name}.jsonl"
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    done = _recallq(env, cwd, "run", str(path), "--model", "stub-judge", "--quiet")
    assert done.returncode == 0, done.stderr[-2000:]
    runs = json.loads(_recallq(env, cwd, "runs", "--json", "--name", path.name).stdout)
    return str(runs[0]["id"])


def _label_from_rule(
    env: dict[str, str], cwd: Path, run: str, items: list[dict[str, Any]], size: int
) -> dict[str, Any]:
    sheet = cwd / f"{run}.csv"
    drawn = _recallq(
        env, cwd, "label", run, "--sample", str(size), "--seed", "11", "--out", str(sheet)
    )
    assert drawn.returncode == 0, drawn.stderr
    by_id = {item["id"]: item for item in items}
    with sheet.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        columns = list(reader.fieldnames or [])
    for row in rows:
        row["human_verdict"] = _truth(by_id[row["item_id"]])[int(row["claim_index"])]
    with sheet.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    imported = _recallq(env, cwd, "label", run, "--import", str(sheet))
    assert imported.returncode == 0, imported.stderr
    shown = _recallq(env, cwd, "agreement", run, "--json")
    assert shown.returncode == 0, shown.stderr
    body: dict[str, Any] = json.loads(shown.stdout)
    return body


def _true_means(items: list[dict[str, Any]]) -> tuple[float, float]:
    truths = [_truth(item) for item in items]
    mean = sum(sum(v == "yes" for v in t.values()) / len(t) for t in truths) / len(truths)
    recall = sum(sum(v == "yes" for v in t.values()) for t in truths) / sum(map(len, truths))
    return mean, recall


def test_labels_of_a_sample_correct_a_judge_that_flips_a_fifth_of_its_verdicts(
    env: dict[str, str], tmp_path: Path, flipping_stub: Any
) -> None:
    flipping_stub.configure(flip_rate=FLIP, flip_seed=3, flip_per_call=False)
    items = _items(2000, seed=1)
    run = _scored(env, tmp_path, items, "flipped")
    body = _label_from_rule(env, tmp_path, run, items, 200)

    assert body["labelled_items"] == 200 and body["sample"] == "random"
    c, n = body["confusion"], body["labelled_claims"]
    # disagreements: the flip rate, within the binomial 95% interval of what was seen
    wrong = (c["judge_yes_human_no"] + c["judge_no_human_yes"]) / n
    assert abs(wrong - FLIP) <= 1.96 * math.sqrt(wrong * (1 - wrong) / n)
    # each direction: flips of the claims that are truly yes, and of those truly no
    human_yes = c["judge_yes_human_yes"] + c["judge_no_human_yes"]
    missed = c["judge_no_human_yes"] / human_yes
    assert abs(missed - FLIP) <= 1.96 * math.sqrt(missed * (1 - missed) / human_yes)
    # kappa: what two raters reach when one is the other with a fifth of its answers flipped
    p = human_yes / n
    q = p * (1 - FLIP) + (1 - p) * FLIP
    chance = p * q + (1 - p) * (1 - q)
    low, high = body["kappa_ci95"]
    assert low <= (1 - FLIP - chance) / (1 - chance) <= high

    true_mean, true_recall = _true_means(items)
    corrected = body["corrected"]
    assert corrected["mean_score_ci95"][0] <= true_mean <= corrected["mean_score_ci95"][1]
    assert corrected["claim_recall_ci95"][0] <= true_recall <= corrected["claim_recall_ci95"][1]
    view = json.loads(_recallq(env, tmp_path, "status", run, "--json").stdout)
    judge_low, judge_high = view["summary"]["mean_ci95"]
    assert not judge_low <= true_mean <= judge_high  # the judge alone is confidently wrong

    grouped = json.loads(
        _recallq(env, tmp_path, "agreement", run, "--by", "region", "--json").stdout
    )
    assert set(grouped["by_group"]) == {"north", "south"}
    assert all(g["corrected"] is not None for g in grouped["by_group"].values())


def test_no_flips_agree_fully_and_correct_nothing(
    env: dict[str, str], tmp_path: Path, flipping_stub: Any
) -> None:
    flipping_stub.configure(flip_rate=0.0)
    items = _items(300, seed=2)
    run = _scored(env, tmp_path, items, "exact")
    body = _label_from_rule(env, tmp_path, run, items, 100)
    assert body["kappa"] == 1.0 and body["agreement"] == 1.0
    corrected = body["corrected"]
    assert corrected["mean_score"] == corrected["judge_mean_score"]
    assert corrected["claim_recall"] == corrected["judge_claim_recall"]


def test_the_same_judge_twice_flips_at_two_p_one_minus_p_per_call_and_never_by_text(
    env: dict[str, str], tmp_path: Path, flipping_stub: Any
) -> None:
    items = _items(400, seed=3)
    flipping_stub.configure(flip_rate=FLIP, flip_per_call=False, flip_seed=9)
    first, second = _scored(env, tmp_path, items, "d1"), _scored(env, tmp_path, items, "d2")
    fixed = json.loads(
        _recallq(env, tmp_path, "agreement", first, "--against", second, "--json").stdout
    )
    assert fixed["labelled_claims"] > 1000 and fixed["flip_rate"] == 0.0

    flipping_stub.configure(flip_per_call=True, seed=4)
    third, fourth = _scored(env, tmp_path, items, "r1"), _scored(env, tmp_path, items, "r2")
    shown = _recallq(env, tmp_path, "agreement", third, "--against", fourth, "--json")
    assert shown.returncode == 0, shown.stderr
    body = json.loads(shown.stdout)
    low, high = body["flip_rate_ci95"]
    assert low <= 2 * FLIP * (1 - FLIP) <= high
    assert len(body["flipped"]) == min(100, round(body["flip_rate"] * body["labelled_claims"]))
    flipping_stub.configure(flip_rate=0.0, flip_per_call=False)
