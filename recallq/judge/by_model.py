"""Which judge serves a model name: built on first use, once per process, with the shared pieces
an LLM judge needs from its runtime (rate limiter, call gate, retry policy)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from recallq.coordination.breaker import CircuitBreaker
from recallq.coordination.call_gate import CallGate
from recallq.coordination.ratelimit import RateLimiter
from recallq.core.errors import PermanentJudgeError
from recallq.core.redact import Redactor
from recallq.judge.backoff import Backoff
from recallq.judge.base import Judge
from recallq.judge.lexical import LexicalJudge
from recallq.judge.models import LEXICAL, JudgeModelsError, ModelConfig, pack_size
from recallq.judge.protocol import DEFAULT_LIMITS, AnswerLimits


class JudgeRegistry:
    def __init__(
        self,
        models: Mapping[str, ModelConfig],
        limiter_for: Callable[[ModelConfig], RateLimiter],
        gate: CallGate,
        breaker: CircuitBreaker,
        policy: Backoff,
        request_timeout: float,
        extraction_pack: int,
        judges: Mapping[str, Judge] | None = None,
        redact: Redactor | None = None,
        limits: AnswerLimits = DEFAULT_LIMITS,
    ) -> None:
        """`judges` are ready-made judges by name (tests put doubles of a provider here);
        `redact` takes secrets out of provider error text and answers (see recallq.core.redact);
        `limits` bound what an answer may hold."""
        self.models = models
        self._limiter_for = limiter_for
        self._gate = gate
        self.breaker = breaker
        self._policy = policy
        self._timeout = request_timeout
        self._pack = extraction_pack
        self._redact = redact
        self._limits = limits
        self._judges: dict[str, Judge] = {LEXICAL: LexicalJudge(), **(judges or {})}
        self._lock = threading.Lock()

    def get(self, name: str) -> Judge:
        """The judge of a model; a model this process cannot call fails its items at once."""
        with self._lock:
            if name not in self._judges:
                self._judges[name] = self._build(name)
            return self._judges[name]

    def pack_size(self, name: str) -> int:
        """Ground truths one extraction call of this model may carry (judge_models)."""
        return pack_size(self.models.get(name), self._pack)

    def _build(self, name: str) -> Judge:
        config = self.models.get(name)
        if config is None:
            raise PermanentJudgeError(f"model {name!r} is not in this worker's models file")
        from recallq.judge.llm import LLMJudge  # a model on the litellm lane imports litellm

        try:
            limiter = self._limiter_for(config)
            return LLMJudge(
                config,
                self._policy,
                limiter,
                self._gate,
                self.breaker,
                self._timeout,
                self._redact,
                self._limits,
            )
        except JudgeModelsError as exc:  # a missing key fails each item at once, not later
            raise PermanentJudgeError(str(exc)) from exc
