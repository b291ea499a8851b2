"""Untrusted JSON and text, checked before anything else looks at them. Pure, no I/O.

What a client sends ends up in Postgres text and JSON columns, in prompts and in exports, and
several things that Python's json module accepts break one of those (and used to surface as a
500 with the client's data in the log):

- NaN, Infinity and numbers too large for a double (`1e400` parses as infinity): not JSON,
  and Postgres refuses them;
- a NUL character: Postgres text cannot hold one;
- a lone surrogate (`"\\ud800"`): not encodable as UTF-8;
- nesting deeper than a limit: Python's encoders and decoders recurse;
- an integer of thousands of digits: Python refuses to convert it (ValueError).

`loads` parses and checks; `check_text` checks one string (path and query parameters).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

# NUL, and the surrogate code points (paired surrogates were already joined by the decoder)
_UNSAFE_CHARACTERS = re.compile("[\x00\ud800-\udfff]")


class UnsafeInput(ValueError):
    """Input that recallq does not accept; the message says what and where."""


def _no_constant(name: str) -> Any:
    raise UnsafeInput(f"{name} is not valid JSON (numbers must be finite)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise UnsafeInput(f"number {text[:40]} is too large")
    return value


def text_problem(text: str) -> str | None:
    """What is wrong with a string, or None."""
    found = _UNSAFE_CHARACTERS.search(text)
    if found is None:
        return None
    return "a NUL character" if found.group() == "\x00" else "a lone UTF-16 surrogate"


def safe_text(text: str) -> str:
    """`text` with each NUL and lone surrogate replaced by U+FFFD (for text recallq did not
    choose to refuse, such as a judge's answer: stored, it must still be storable and
    readable)."""
    return _UNSAFE_CHARACTERS.sub("\ufffd", text)


def check_text(text: str, what: str) -> str:
    problem = text_problem(text)
    if problem is not None:
        raise UnsafeInput(f"{what} contains {problem}")
    return text


def check_value(value: Any, max_depth: int, where: str = "body") -> None:
    """UnsafeInput when a parsed JSON value nests deeper than `max_depth` or holds an unsafe
    string or a non-finite number. Walks without recursion."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        current, depth = stack.pop()
        if isinstance(current, str):
            problem = text_problem(current)
            if problem is not None:
                raise UnsafeInput(f"{where}: a string contains {problem}")
        elif isinstance(current, dict | list):
            if depth >= max_depth:
                raise UnsafeInput(f"{where}: nested deeper than {max_depth} levels")
            if isinstance(current, dict):
                for key, item in current.items():
                    problem = text_problem(key) if isinstance(key, str) else None
                    if problem is not None:
                        raise UnsafeInput(f"{where}: a key contains {problem}")
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in current)
        elif isinstance(current, float) and not math.isfinite(current):
            raise UnsafeInput(f"{where}: numbers must be finite")


def at_column(message: str, column: int) -> str:
    """``message`` placed at a column: "Expecting ',' delimiter at column 34". Some of json's
    messages end in "at" already ("Unterminated string starting at")."""
    return f"{message} {'column' if message.endswith(' at') else 'at column'} {column}"


def json_problem(exc: json.JSONDecodeError) -> str:
    """What is wrong with JSON text and where."""
    return at_column(exc.msg, exc.colno)


def loads(data: bytes | str, max_depth: int, where: str = "body") -> Any:
    """Parse JSON text from a client and check it (see the module docstring)."""
    try:
        value = json.loads(data, parse_constant=_no_constant, parse_float=_finite_float)
    except UnsafeInput as exc:
        raise UnsafeInput(f"{where}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise UnsafeInput(f"{where}: invalid JSON: {json_problem(exc)}") from None
    except UnicodeDecodeError as exc:
        raise UnsafeInput(
            f"{where}: invalid JSON: not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
    except RecursionError:
        raise UnsafeInput(f"{where}: nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise UnsafeInput(f"{where}: {str(exc)[:120]}") from None
    check_value(value, max_depth, where)
    return value
