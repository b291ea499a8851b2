"""What a run would cost before it runs: items, judge calls, tokens and dollars.

Pure but for prices (recallq.judge.prices, which reads litellm's price map as a file, without
importing litellm). Used by `POST /v1/runs?dry_run=true` and `recallq estimate FILE --model M`.

Per item, as the engine does it (judge protocol v1):
- no ground truth: no call;
- extraction: none when the project's claim cache holds the claims (the cached claims are
  what attribution is asked about); else online, one packed call per pack of ground truths
  (up to the model's pack size and the pack token budget; a pack of one is a single-item
  call), and in batch mode one request per item (the batch lane does not pack);
- attribution: one call when the item has context passages, none otherwise;
- relevance (precision "judged"): one context_relevance call when it is attributed.
Online calls are priced at the model's price, batch requests at its batch price.

Prompt tokens are the characters of the messages the protocol would send, divided by four
(providers' tokenisers give about that for English; the answer is an estimate, not a bill).
Claims not yet extracted are guessed with the offline judge's sentence splitter; answers are
sized from them (the claims as JSON; a verdict with a one-sentence reason per claim).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from recallq.judge import protocol
from recallq.judge.lexical import split_claims
from recallq.judge.models import LEXICAL, ModelConfig, pack_size
from recallq.judge.prices import Price, batch_price, online_price

CHARS_PER_TOKEN = 4
# a verdict's JSON is about this long: some 70 characters of keys and values, and a reason of
# one short sentence
VERDICT_CHARS = 120


@dataclass
class Estimate:
    model: str
    mode: str = "online"
    items: int = 0
    calls: int = 0
    extraction_calls: int = 0
    attribution_calls: int = 0
    relevance_calls: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None  # None: the model has no known price

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tokens": self.tokens, "priced": self.cost_usd is not None}


def tokens_of(characters: int) -> int:
    return characters // CHARS_PER_TOKEN


def _message_chars(messages: list[dict[str, str]]) -> int:
    return sum(len(message["content"]) for message in messages)


class Estimator:
    """Adds up what a run's items would take, one item at a time (memory stays flat but for
    the ground truths of one pack)."""

    def __init__(
        self,
        model: str,
        price: Price | None,
        calls_a_model: bool = True,
        pack_size: int = 1,
        pack_tokens: int = 0,
        mode: str = "online",
        precision: str = "cited",
    ) -> None:
        """`calls_a_model`: False for the offline judge, which makes no billed calls.
        `pack_size` / `pack_tokens`: how extraction calls are packed (1: not at all).
        `precision`: the run's; "judged" adds a context_relevance call per attributed item."""
        self._judged = precision == "judged"
        self._estimate = Estimate(model, mode, cost_usd=0.0 if price or not calls_a_model else None)
        self._price = price
        self._calls_a_model = calls_a_model
        self._pack_size = pack_size
        self._pack_tokens = pack_tokens
        self._pack: list[str] = []

    def add(
        self,
        ground_truth: str | None,
        contexts: list[str],
        cached_claims: list[str] | None,
        known_claims: list[str] | None = None,
    ) -> None:
        """One item: its ground truth, its resolved context passages, the claims the claim
        cache holds for it (None: not cached) and the claims it takes from the run that
        `claims_from` names (None: none, it is extracted)."""
        estimate = self._estimate
        estimate.items += 1
        if ground_truth is None or not self._calls_a_model:
            return
        if known_claims is not None:
            claims = known_claims
        elif cached_claims is None:
            claims = split_claims(ground_truth) or [ground_truth]
            self._extract(ground_truth)
        else:
            estimate.cache_hits += 1
            claims = cached_claims
        if contexts and claims:
            prompt = _message_chars(protocol.attribution_messages(claims, contexts))
            self._call("attribution", prompt, len('{"verdicts": []}') + VERDICT_CHARS * len(claims))
            if self._judged:
                passages = list(enumerate(contexts))
                prompt = _message_chars(protocol.relevance_messages(ground_truth, passages))
                answer = len('{"verdicts": []}') + VERDICT_CHARS * len(contexts)
                self._call("relevance", prompt, answer)

    def _extract(self, ground_truth: str) -> None:
        """Into the current pack (the engine packs consecutive items the same way)."""
        tokens = sum(len(text) for text in self._pack) // CHARS_PER_TOKEN
        if self._pack and (
            len(self._pack) >= self._pack_size
            or tokens + len(ground_truth) // CHARS_PER_TOKEN > self._pack_tokens
        ):
            self._send_pack()
        self._pack.append(ground_truth)

    def _send_pack(self) -> None:
        texts, self._pack = self._pack, []
        if not texts:
            return
        claims = [split_claims(text) or [text] for text in texts]
        answer: dict[str, Any]
        if len(texts) == 1:
            prompt = _message_chars(protocol.extraction_messages(texts[0]))
            answer = {"claims": claims[0]}
        else:
            prompt = _message_chars(protocol.packed_extraction_messages(texts))
            answer = {"items": [{"index": i, "claims": c} for i, c in enumerate(claims)]}
        self._call("extraction", prompt, len(json.dumps(answer, ensure_ascii=False)))

    def _call(self, kind: str, prompt_chars: int, answer_chars: int) -> None:
        estimate = self._estimate
        estimate.calls += 1
        if kind == "extraction":
            estimate.extraction_calls += 1
        elif kind == "relevance":
            estimate.relevance_calls += 1
        else:
            estimate.attribution_calls += 1
        prompt, completion = tokens_of(prompt_chars), tokens_of(answer_chars)
        estimate.prompt_tokens += prompt
        estimate.completion_tokens += completion
        if self._price is not None and estimate.cost_usd is not None:
            estimate.cost_usd += self._price.cost(prompt, completion)

    def result(self) -> Estimate:
        self._send_pack()
        estimate = Estimate(**asdict(self._estimate))
        if estimate.cost_usd is not None:
            estimate.cost_usd = round(estimate.cost_usd, 6)
        return estimate


def estimator_for(
    model: str,
    models: Mapping[str, ModelConfig],
    settings_pack: int = 1,
    pack_tokens: int = 0,
    mode: str = "online",
    precision: str = "cited",
) -> Estimator:
    """An estimator for a model of the models file (or the offline judge), in `mode`; online
    extraction packs as the engine does (`settings_pack`: RECALLQ_EXTRACTION_PACK)."""
    if model == LEXICAL:
        return Estimator(model, None, calls_a_model=False, mode=mode)
    config = models.get(model)
    if mode == "batch":
        price = batch_price(config) if config is not None else None
        return Estimator(model, price, mode=mode, precision=precision)
    price = online_price(config) if config is not None else None
    pack = pack_size(config, settings_pack)
    return Estimator(
        model, price, pack_size=pack, pack_tokens=pack_tokens, mode=mode, precision=precision
    )
