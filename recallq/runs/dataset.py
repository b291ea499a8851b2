"""Datasets as people have them: files and frames in, canonical recallq items out.

Pure (no database, no network); the only I/O is reading the file the user named. Flow::

    path ──read_records──┐
    list / iterable ─────┼─ records_from ─> raw dicts ─ normalise ─> canonical items
    pandas DataFrame ────┘       (items_from does both, naming file and line in errors)

A canonical item is ``{"id"?, "input"?, "output"?, "ground_truth"?, "context"?, "metadata"?}``
with absent keys left out, because recallq's context resolution tells a missing ``context``
(fall back to the run's extractor or static context) from ``context: []`` (nothing retrieved).

Readers stream (recallq.runs.data_files), so memory stays flat in the size of the file. Every
error is a :class:`DatasetError` with a one-line message naming the file and line (or the
item).
"""

from __future__ import annotations

__all__ = [
    "CANONICAL_FIELDS",
    "FIELD_ALIASES",
    "DatasetError",
    "items_from",
    "normalise",
    "parse_mapping",
    "read_records",
    "records_from",
]

import difflib
import json
from collections.abc import Iterable, Iterator, Mapping
from os import PathLike
from pathlib import Path
from typing import Any

from recallq.runs.data_files import (
    ALIAS_TO_FIELD,
    CANONICAL_FIELDS,
    FIELD_ALIASES,
    LIST_JOINED_ALIASES,
    METADATA,
    DatasetError,
    file_records,
    kind_of,
    located_records,
    quoted_list,
)

#: Mapping targets besides the canonical fields: ``-`` drops the field, ``metadata`` keeps it in
#: the item's metadata under its own name, ``metadata.NAME`` under NAME. DeepEval's ``context``
#: (the ideal context, beside the retrieved ``retrieval_context``) is the usual case:
#: ``context=metadata.ideal_context``.
#: Keys of a passage object holding its text, first present wins (LlamaIndex/Haystack use
#: ``text``/``content``, LangChain's Document ``page_content``).
PASSAGE_TEXT_KEYS = ("text", "page_content", "content")

DROP = "-"

#: Compact-JSON size limit of one item's metadata: it is stored on every item row and sent back
#: with every result, so a stray HTML page or embedding vector must not ride along unnoticed.
MAX_METADATA_BYTES = 16 * 1024

# Typo hints compare lower-cased names; short names ("id") only match exactly, because fuzzy
# matching of two-letter names flags ordinary fields ("idx", "uid").
_TYPO_TARGETS = {name.lower(): name for name in (*CANONICAL_FIELDS, *ALIAS_TO_FIELD)}
_TYPO_MIN_FUZZY_LENGTH = 4
# 0.85 catches dropped, doubled and swapped letters ("contxt" 0.92, "ground_thruth" 0.96,
# "refrence" 0.94) but not suffixed names ("query_id" 0.77, "contexts_v2" 0.84).
_TYPO_CUTOFF = 0.85


# --- public API ------------------------------------------------------------------------------


def read_records(
    path: str | PathLike[str], *, mapping: Mapping[str, str] | None = None
) -> Iterator[dict[str, Any]]:
    """Stream the raw records of a JSONL, JSON array, CSV or Parquet file.

    The format comes from the suffix (``.jsonl``/``.ndjson``/``.json``, ``.csv``,
    ``.parquet``); a JSON-family file is read by its first non-blank character (``[`` an
    array, ``{`` one object per line), and a file with another suffix is sniffed the same way,
    then as CSV with a header naming a known field. ``mapping`` (the user's field mapping) only
    tells the CSV reader which columns hold passage lists.
    """
    for _, record in file_records(Path(path), mapping or {}):
        yield record


def records_from(
    data: Any, *, mapping: Mapping[str, str] | None = None
) -> Iterator[dict[str, Any]]:
    """Raw records from a path, an iterable of dicts, or a pandas DataFrame (duck-typed).

    DataFrame cells that are None/NaN/NA/NaT are absent fields; numpy values become Python
    values and timestamps ISO-8601 strings, so the records are plain JSON-shaped dicts.
    """
    for _, record in located_records(data, mapping or {}):
        yield record


def items_from(data: Any, *, mapping: Mapping[str, str] | None = None) -> Iterator[dict[str, Any]]:
    """Canonical items from anything :func:`records_from` takes, numbered from 0.

    Errors name where the record came from: ``data.csv line 4: item 2 (q3): ...``.
    """
    mapping = mapping or {}
    index = -1
    for index, (where, record) in enumerate(located_records(data, mapping)):
        try:
            item = normalise(record, index, mapping)
        except DatasetError as exc:
            if where is None:
                raise
            raise DatasetError(f"{where}: {exc}") from None
        yield item
    if index < 0 and isinstance(data, str | PathLike):
        raise DatasetError(f"{data}: the file holds no items")


def normalise(
    record: Mapping[str, Any], index: int, mapping: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The canonical item for one raw record (see the module docstring).

    ``mapping`` (``{"source_field": "target"}``) is applied before the aliases of
    :data:`FIELD_ALIASES`; a target is a canonical field, ``metadata`` or ``metadata.NAME``
    (kept as metadata, under NAME), or ``-`` (dropped). A field with value ``None`` counts as
    absent. Fields that are neither canonical nor aliases become ``metadata``; an explicit
    ``metadata`` object is merged in and its keys win over same-named top-level fields, since it
    is what the writer deliberately marked as metadata while top-level extras are whatever else
    the file happened to carry. Only ``context`` is reshaped (to a list of passage strings);
    ``input`` and ``output`` pass through untouched, so agent-shaped items keep their message
    lists.
    """
    targets = _checked_mapping(mapping or {})
    sources: dict[str, list[str]] = {}
    extras: dict[str, Any] = {}
    mapped_metadata: dict[str, Any] = {}
    explicit_metadata: dict[str, Any] = {}
    for name, value in record.items():
        if not isinstance(name, str):
            raise DatasetError(f"item {index}: field names must be strings, got {name!r}")
        target = targets.get(name)
        if target == DROP:
            continue
        if target is not None and _metadata_target(target):
            mapped_metadata[target.partition(".")[2] or name] = value
            continue
        canonical = target or (name if name in CANONICAL_FIELDS else ALIAS_TO_FIELD.get(name))
        if canonical is not None:
            if value is not None:
                sources.setdefault(canonical, []).append(name)
        elif name == "metadata" and isinstance(value, dict):
            explicit_metadata = value
        else:
            extras[name] = value

    label = _item_label(index, record[sources["id"][0]] if "id" in sources else None)
    for canonical, names in sources.items():
        if len(names) > 1:
            raise DatasetError(f"{label}: {_two_sources_message(canonical, names)}")
    missing = set(CANONICAL_FIELDS) - set(sources)
    for name in extras:
        hint = _typo_target(name, missing)
        if hint is not None:
            raise DatasetError(f"{label}: unknown field {name!r}; did you mean {hint!r}?")

    item: dict[str, Any] = {}
    for canonical in CANONICAL_FIELDS:
        if canonical not in sources:
            continue
        source = sources[canonical][0]
        value = record[source]
        if canonical == "context":
            value = _passages(value, label)
        elif source in LIST_JOINED_ALIASES and canonical == "ground_truth":
            value = _joined_ground_truths(value, source, label)
        item[canonical] = value
    metadata = {**extras, **mapped_metadata, **explicit_metadata}
    if metadata:
        _check_metadata(metadata, label)
        item["metadata"] = metadata
    return item


# --- normalising one record ------------------------------------------------------------------


def parse_mapping(pairs: Iterable[str]) -> dict[str, str]:
    """A mapping from ``SOURCE=TARGET`` texts (the CLI's ``--map``; a text may hold several,
    separated by commas), checked as :func:`normalise` checks it."""
    mapping: dict[str, str] = {}
    for text in pairs:
        for pair in filter(None, (part.strip() for part in text.split(","))):
            source, equals, target = (side.strip() for side in pair.partition("="))
            if not equals or not source or not target:
                raise DatasetError(
                    f"mapping {pair!r}: write SOURCE=TARGET, e.g. reference=ground_truth"
                )
            if source in mapping and mapping[source] != target:
                raise DatasetError(
                    f"mapping: {source!r} is mapped twice ({mapping[source]} and {target})"
                )
            mapping[source] = target
    return dict(_checked_mapping(mapping))


def _metadata_target(target: str) -> bool:
    """``metadata`` or ``metadata.NAME`` (with a NAME)."""
    prefix, dot, name = target.partition(".")
    return prefix == METADATA and bool(name) == bool(dot)


def _checked_mapping(mapping: Mapping[str, str]) -> Mapping[str, str]:
    for source, target in mapping.items():
        if target not in CANONICAL_FIELDS and target != DROP and not _metadata_target(target):
            raise DatasetError(
                f"mapping {source}={target}: {target!r} is not an item field; "
                f"map to one of {', '.join(CANONICAL_FIELDS)}, to metadata or metadata.NAME "
                f"(kept as metadata), or to {DROP} (dropped)"
            )
    return mapping


def _two_sources_message(canonical: str, names: list[str]) -> str:
    both = "both" if len(names) == 2 else "all"
    problem = f"fields {quoted_list(names)} {both} give {canonical!r}"
    if canonical == "context" and "context" in names:
        # DeepEval's files: `context` is the ideal context and an alias carries the retrieved
        # passages, which are what context recall scores; dropping the alias would score the
        # ideal context against itself.
        retrieved = next(name for name in names if name != "context")
        return (
            f"{problem}; in DeepEval's files 'context' is the ideal context: "
            f"--map context=metadata.ideal_context keeps it as metadata and scores "
            f"{retrieved!r} (or --map context=- drops it)"
        )
    kept = names[0]
    return (
        f"{problem}; keep one of them, or map the others away ({kept}=metadata keeps one as "
        f"metadata, {kept}=- drops it)"
    )


def _item_label(index: int, key: Any) -> str:
    return f"item {index}" if key is None else f"item {index} ({key})"


_TEXT_KEYS_OR = quoted_list(list(PASSAGE_TEXT_KEYS), "or")


def _typo_target(name: str, missing: set[str]) -> str | None:
    """The canonical field or alias ``name`` looks like a misspelling of, when that field is
    missing from the record (a look-alike beside the real field is just metadata)."""
    wanted = {
        lowered: spelled
        for lowered, spelled in _TYPO_TARGETS.items()
        if ALIAS_TO_FIELD.get(spelled, spelled) in missing
    }
    lowered_name = name.lower()
    if lowered_name in wanted:
        return wanted[lowered_name]
    fuzzy = [target for target in wanted if len(target) >= _TYPO_MIN_FUZZY_LENGTH]
    close = difflib.get_close_matches(lowered_name, fuzzy, n=1, cutoff=_TYPO_CUTOFF)
    return wanted[close[0]] if close else None


def _passages(value: Any, label: str) -> list[str]:
    """A context value as passage strings: one string is one passage; ``None`` entries drop."""
    if isinstance(value, list | tuple):
        return [_passage_text(p, i, label) for i, p in enumerate(value) if p is not None]
    if isinstance(value, str | dict) or _text_attribute(value) is not None:
        return [_passage_text(value, 0, label)]
    raise DatasetError(
        f"{label}: context must be a list of passages (strings or objects with "
        f"{_TEXT_KEYS_OR}), got {kind_of(value)}"
    )


def _text_attribute(value: Any) -> str | None:
    """Text of a document object (a LangChain ``Document`` passed in-process, not a dict)."""
    for key in PASSAGE_TEXT_KEYS:
        text = getattr(value, key, None)
        if isinstance(text, str):
            return text
    return None


def _passage_text(passage: Any, position: int, label: str) -> str:
    if isinstance(passage, str):
        return passage
    if isinstance(passage, dict):
        for key in PASSAGE_TEXT_KEYS:
            text = passage.get(key)
            if text is None:
                continue
            if not isinstance(text, str):
                raise DatasetError(
                    f"{label}: context passage {position}: {key!r} must be a string, "
                    f"got {kind_of(text)}"
                )
            return text
        found = sorted(map(str, passage))
        shown = ", ".join(map(repr, found[:10])) + (", ..." if len(found) > 10 else "")
        raise DatasetError(
            f"{label}: context passage {position} has no {_TEXT_KEYS_OR} text "
            f"(its keys: {shown or 'none'})"
        )
    text = _text_attribute(passage)
    if text is not None:
        return text
    raise DatasetError(
        f"{label}: context passage {position} is {kind_of(passage)}; passages are strings or "
        f"objects with {_TEXT_KEYS_OR}"
    )


def _joined_ground_truths(value: Any, source: str, label: str) -> Any:
    if not isinstance(value, list | tuple):
        return value
    texts = [text for text in value if text is not None]
    if not all(isinstance(text, str) for text in texts):
        raise DatasetError(f"{label}: {source!r} must be a list of strings")
    return "\n".join(texts)


def _check_metadata(metadata: dict[str, Any], label: str) -> None:
    """Every value must be JSON (no NaN/inf), and the whole compact JSON at most the limit."""
    sizes: dict[str, int] = {}
    for key, value in metadata.items():
        try:
            text = json.dumps(
                {key: value}, ensure_ascii=False, allow_nan=False, separators=(",", ":")
            )
        except ValueError as exc:
            why = "NaN and infinity are not allowed" if "Out of range" in str(exc) else str(exc)
            raise DatasetError(f"{label}: metadata field {key!r} is not valid JSON: {why}") from exc
        except TypeError as exc:
            raise DatasetError(f"{label}: metadata field {key!r} is not valid JSON: {exc}") from exc
        sizes[key] = len(text.encode()) - 2  # without the braces
    total = 2 + sum(sizes.values()) + len(sizes) - 1  # braces and commas
    if total > MAX_METADATA_BYTES:
        largest = max(sizes, key=sizes.__getitem__)
        raise DatasetError(
            f"{label}: metadata is {total / 1024:.1f} KiB of JSON, above the "
            f"{MAX_METADATA_BYTES // 1024} KiB limit (largest field: {largest!r}, "
            f"{sizes[largest] / 1024:.1f} KiB); drop or shorten fields"
        )
