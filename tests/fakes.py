"""The test doubles tests share: a scripted judge (judge protocol v1, no provider) and a
recording work queue (the engine's WorkQueue, sending nowhere). Everything else a test needs is
real: the store, the database, Redis, the stub provider through litellm."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from recallq.core.errors import JudgeError
from recallq.core.outcomes import Taken
from recallq.core.usage import Usage
from recallq.judge.base import JudgeReply, PackedReply, Repair


class ScriptedJudge:
    """A judge that answers without a provider: each ground truth is its one claim, and every
    claim is attributed ("yes", to the first passage). The script changes that:

    - `fails`: an error raised by extraction for ground truths containing the text it is keyed by
      (the first that matches);
    - `trouble`: an error attribution raises while it is set (a test sets and clears it);
    - `during_attribution`: called inside each attribution call (a test steals the item there).

    `extraction_calls` and `attribution_calls` count the calls; each answer uses `usage`."""

    def __init__(
        self,
        name: str,
        *,
        usage: Usage = Usage(llm_calls=1),  # noqa: B008  (a frozen value)
        fails: Mapping[str, Callable[[], JudgeError]] | None = None,
    ) -> None:
        self.name = name
        self.usage = usage
        self.fails = dict(fails or {})
        self.trouble: JudgeError | None = None
        self.during_attribution: Callable[[], object] = lambda: None
        self.extraction_calls = 0
        self.attribution_calls = 0
        self.relevance_calls = 0

    def extract_claims(
        self, ground_truth: str, run_id: str, repair: Repair | None = None
    ) -> JudgeReply:
        self.extraction_calls += 1
        for marker, error in self.fails.items():
            if marker in ground_truth:
                raise error()
        return JudgeReply({"claims": [ground_truth]}, self.usage)

    def extract_claims_packed(self, ground_truths: list[str], run_id: str) -> PackedReply:
        claims = {
            i: self.extract_claims(text, run_id).data["claims"]
            for i, text in enumerate(ground_truths)
        }
        return PackedReply(claims, self.usage)

    def attribute(
        self, claims: list[str], contexts: list[str], run_id: str, repair: Repair | None = None
    ) -> JudgeReply:
        self.attribution_calls += 1
        self.during_attribution()
        if self.trouble is not None:
            raise self.trouble
        verdicts = [
            {"claim_index": i, "verdict": "yes", "context_indices": [0], "reason": "stated"}
            for i in range(len(claims))
        ]
        return JudgeReply({"verdicts": verdicts}, self.usage)

    def judge_relevance(
        self,
        ground_truth: str,
        contexts: list[tuple[int, str]],
        run_id: str,
        repair: Repair | None = None,
    ) -> JudgeReply:
        self.relevance_calls += 1
        verdicts = [
            {"context_index": i, "verdict": "yes" if i == 0 else "no", "reason": "first"}
            for i, _ in contexts
        ]
        return JudgeReply({"verdicts": verdicts}, self.usage)


class RecordingQueue:
    """A work queue that sends nothing and records what the engine sent: the items to score,
    the runs to dispatch, the items sent on to attribution."""

    def __init__(self) -> None:
        self.items: list[int] = []
        self.dispatched: list[str] = []
        self.attributions: list[Taken] = []

    def send_items(self, item_ids: Sequence[int]) -> None:
        self.items += item_ids

    def send_attributions(self, passes: Sequence[Taken]) -> None:
        self.attributions += passes

    def send_dispatch(self, run_id: str) -> None:
        self.dispatched.append(run_id)
