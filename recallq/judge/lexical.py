"""Offline judge ``local/lexical``: a deterministic word-overlap baseline.

This is not an LLM. Claims are cut out of the ground truth with regular expressions,
and a context "supports" a claim when it contains every number in the claim and at
least ``SUPPORT_THRESHOLD`` of the claim's content words. It answers judge protocol v1
in the same shapes as an LLM judge, needs no network or key and costs nothing, but it
is only a lexical baseline: it misses paraphrase and synonyms ("died" vs "passed
away"), ignores negation ("did not win" matches "won"), and can be fooled by a
context that merely mentions the same words.

Only the standard library is imported here, so the default ``recallq run`` stays light.
"""

from __future__ import annotations

import re
from typing import Any

from recallq.judge.base import JudgeReply, PackedReply, Repair

__all__ = ["LexicalJudge", "split_claims", "supporting_contexts"]

SUPPORT_THRESHOLD = 0.6
"""Fraction of a claim's content words that one context must contain to support it."""

MIN_CLAUSE_WORDS = 3
"""Content words each side needs before a sentence is split at ", and"."""

MIN_SEMICOLON_CLAUSE_WORDS = 2
"""Content words each side needs before a sentence is split at "; "."""

_STOPWORD_TEXT = """
    a about after again all also am an and any are as at be been before being both but
    by can could did do does doing down during each either for from further had has have
    having he her here hers him his how i if in into is it its just may me might must my
    neither no nor not of off on once only or other our ours out over own same shall she
    should so some such than that the their theirs them then there these they this those
    to under up us very was we were what when where which while who whom why will with
    would you your yours s t dont doesnt didnt isnt arent wasnt werent cant wont
"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())
"""A small English stopword list (compared casefolded, before normalisation)."""

_ABBREVIATION_TEXT = """
    mr mrs ms dr prof sr jr st mt vs gen col lt sgt capt rev hon inc ltd co corp dept
    approx fig est ph.d jan feb mar apr jun jul aug sep sept oct nov dec
"""
ABBREVIATIONS = frozenset(_ABBREVIATION_TEXT.split())
"""Words that end in a full stop without ending the sentence (compared casefolded)."""

_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d{1,3}[.)])\s+")
_SENTENCE_END = re.compile(r"[.!?]+[\"'\u201d\u2019)\]]*\s+")
_CLAUSE_SEPARATOR = re.compile(r"\s*;\s+|,\s+and\s+", re.IGNORECASE)
_TRAILING_PUNCT = re.compile(r"[\s.,;:!?]+$")
_DOTTED_ABBREVIATION = re.compile(r"(?:[^\W\d_]\.)+[^\W\d_]")  # e.g, i.e, u.s, a.m
_POSSESSIVE = re.compile(r"['\u2019]s\b")
_APOSTROPHE = re.compile(r"['\u2019]")
# 1,000,000 and 3.5 first, so they stay one token; then any alphanumeric run.
_TOKEN = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d)|\d+\.\d+|[^\W_]+")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def split_claims(ground_truth: str) -> list[str]:
    """Split a ground truth into claims, keeping each claim's wording verbatim.

    1. Every line is a boundary; a leading bullet ("- ", "* ", "1. ", "1) ") is dropped.
    2. A line is split into sentences after ".", "!" or "?" followed by whitespace, except
       after an abbreviation: a word in ``ABBREVIATIONS`` ("Dr."), a dotted one ("e.g.",
       "U.S.") or a single capital letter (an initial, "J."). Decimals such as 3.5 never
       split, since no whitespace follows their dot.
    3. A sentence is split into clauses at "; " when both sides have at least
       ``MIN_SEMICOLON_CLAUSE_WORDS`` content words, and at ", and" (never a bare " and") when both
       sides have at least ``MIN_CLAUSE_WORDS`` (so "Tom and Jerry ..." stays whole).
       Separators are tried left to right against the whole remainder of the sentence.
    4. Surrounding whitespace and trailing punctuation are stripped (an abbreviation keeps
       its final dot); fragments without any content word are dropped.
    """
    claims: list[str] = []
    for line in ground_truth.splitlines():
        text = _BULLET.sub("", line).strip()
        for sentence in _split_sentences(text):
            for clause in _split_clauses(sentence):
                claim = _clean(clause)
                if _content_words(claim):
                    claims.append(claim)
    return claims


def supporting_contexts(claim: str, contexts: list[str]) -> list[int]:
    """Indices, in order, of the contexts that support ``claim``.

    A context supports a claim when it contains every number of the claim and at least
    ``SUPPORT_THRESHOLD`` of the claim's content words. A claim without content words is
    supported by nothing.
    """
    words = _content_words(claim)
    return _supporting(words, [set(_content_words(context)) for context in contexts])


class LexicalJudge:
    """Judge protocol v1 answered by word overlap; see the module docstring for limits."""

    name = "local/lexical"
    prompt_version = "lexical-1"

    # Its answers are never malformed, so it is never asked to repair one (`repair`).

    def extract_claims(
        self, ground_truth: str, run_id: str = "", repair: Repair | None = None
    ) -> JudgeReply:
        return JudgeReply(data={"claims": split_claims(ground_truth)})

    def extract_claims_packed(self, ground_truths: list[str], run_id: str = "") -> PackedReply:
        return PackedReply({i: split_claims(text) for i, text in enumerate(ground_truths)})

    def attribute(
        self,
        claims: list[str],
        contexts: list[str],
        run_id: str = "",
        repair: Repair | None = None,
    ) -> JudgeReply:
        context_words = [set(_content_words(context)) for context in contexts]
        verdicts = [_verdict(index, claim, context_words) for index, claim in enumerate(claims)]
        return JudgeReply(data={"verdicts": verdicts})

    def judge_relevance(
        self,
        ground_truth: str,
        contexts: list[tuple[int, str]],
        run_id: str = "",
        repair: Repair | None = None,
    ) -> JudgeReply:
        """A passage is relevant when it supports one of the ground truth's claims (the rule
        attribution uses, so `judged` and `cited` agree for this judge)."""
        claims = [_content_words(claim) for claim in split_claims(ground_truth)]
        verdicts = []
        for index, text in contexts:
            words = [set(_content_words(text))]
            supported = [i for i, claim in enumerate(claims) if _supporting(claim, words)]
            verdicts.append(
                {
                    "context_index": index,
                    "verdict": "yes" if supported else "no",
                    "reason": (
                        f"supports claim(s) {', '.join(map(str, supported))}"
                        if supported
                        else "supports none of the ground truth's claims"
                    ),
                }
            )
        return JudgeReply(data={"verdicts": verdicts})


def _split_sentences(line: str) -> list[str]:
    sentences: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(line):
        terminator = match.group()
        before = line[start : match.start()].split()
        single_dot = terminator.startswith(".") and not terminator.startswith("..")
        if single_dot and before and _is_abbreviation(before[-1]):
            continue
        sentences.append(line[start : match.end()])
        start = match.end()
    sentences.append(line[start:])
    return sentences


def _split_clauses(sentence: str) -> list[str]:
    clauses: list[str] = []
    start = 0
    for match in _CLAUSE_SEPARATOR.finditer(sentence):
        left, right = sentence[start : match.start()], sentence[match.end() :]
        needed = MIN_SEMICOLON_CLAUSE_WORDS if ";" in match.group() else MIN_CLAUSE_WORDS
        if len(_content_words(left)) >= needed and len(_content_words(right)) >= needed:
            clauses.append(left)
            start = match.end()
    clauses.append(sentence[start:])
    return clauses


def _clean(fragment: str) -> str:
    text = fragment.strip()
    stripped = _TRAILING_PUNCT.sub("", text)
    words = stripped.split()
    if words and text[len(stripped) :].startswith(".") and _is_abbreviation(words[-1]):
        stripped += "."
    return stripped


def _is_abbreviation(word: str) -> bool:
    word = word.lstrip("([{\"'\u201c\u2018")
    folded = word.casefold()
    return (
        folded in ABBREVIATIONS
        or _DOTTED_ABBREVIATION.fullmatch(folded) is not None
        or (len(word) == 1 and word.isalpha() and word.isupper())
    )


def _content_words(text: str) -> dict[str, str]:
    """Normalised content word -> its first surface form (casefolded) in ``text``."""
    words: dict[str, str] = {}
    folded = _APOSTROPHE.sub("", _POSSESSIVE.sub("", text.casefold()))
    for match in _TOKEN.finditer(folded):
        surface = match.group()
        if surface in STOPWORDS:
            continue
        words.setdefault(_normalise(surface), surface)
    return words


def _normalise(token: str) -> str:
    """1,000 -> 1000; countries -> country; prizes -> prize (not glass -> glas)."""
    token = token.replace(",", "")
    if len(token) > 4 and token.endswith("ies"):
        return token[:-3] + "y"
    if len(token) > 3 and token.endswith("s") and not token.endswith("ss"):
        return token[:-1]
    return token


def _is_number(word: str) -> bool:
    return _NUMBER.fullmatch(word) is not None


def _matched(words: dict[str, str], context: set[str]) -> int:
    return sum(word in context for word in words)


def _supporting(words: dict[str, str], context_words: list[set[str]]) -> list[int]:
    if not words:
        return []
    numbers = [word for word in words if _is_number(word)]
    return [
        index
        for index, context in enumerate(context_words)
        if all(number in context for number in numbers)
        and _matched(words, context) / len(words) >= SUPPORT_THRESHOLD
    ]


def _verdict(index: int, claim: str, context_words: list[set[str]]) -> dict[str, Any]:
    words = _content_words(claim)
    supporting = _supporting(words, context_words)
    if supporting:
        reason = "; ".join(
            f"matched {_matched(words, context_words[i])}/{len(words)} content words in context {i}"
            for i in supporting
        )
        verdict = "yes"
    else:
        reason = _unsupported_reason(words, context_words)
        verdict = "no"
    return {
        "claim_index": index,
        "verdict": verdict,
        "context_indices": supporting,
        "reason": reason,
    }


def _unsupported_reason(words: dict[str, str], context_words: list[set[str]]) -> str:
    if not context_words:
        return "no context provided"
    if not words:
        return "claim has no content words"
    missing = [
        surface
        for word, surface in words.items()
        if not any(word in context for context in context_words)
    ]
    if missing:
        return "no context contains: " + ", ".join(missing)
    best = max(range(len(context_words)), key=lambda i: _matched(words, context_words[i]))
    matched = _matched(words, context_words[best])
    reason = f"best match is context {best} with {matched}/{len(words)} content words"
    lacking = [s for w, s in words.items() if _is_number(w) and w not in context_words[best]]
    if lacking:
        reason += " but it lacks " + ", ".join(lacking)
    return reason
