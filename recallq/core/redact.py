"""Secrets out of text that recallq stores, exports or logs.

Provider error text ends up in items, in CSV exports and in logs, and some providers echo the
request back, Authorization header and all. A Redactor built with the configured keys' values
takes out those values wherever they appear, plus anything shaped like a credential: bearer
tokens and Authorization headers, well-known key formats, `api_key=...` style assignments
and passwords in URLs. It leans towards taking out too much: a word that follows "Bearer " and
looks like a token is gone, even if it was not one.

Everything is compiled once (the Redactor's own pattern when it is built); a call is a few
linear regex scans, and no pattern can backtrack more than a bounded amount per position.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

REDACTED = "[redacted]"
# redact_url keeps a URL a URL, as SQLAlchemy does when it hides a password
URL_MASK = "***"
# Shorter configured values would take out ordinary words; keys are far longer anyway.
MIN_SECRET_LENGTH = 6

# Well-known key formats, matched as whole tokens so that "task-force" or "sk-learn" survive.
_KEY_FORMATS = re.compile(
    r"(?<![A-Za-z0-9_-])(?:"
    # OpenAI sk-..., sk-proj-..., sk-svcacct-..., and Anthropic sk-ant-api03-...; `*` because
    # providers quote keys half-masked ("sk-proj-****abcd"), which still shows the tail
    r"sk-[A-Za-z0-9_*-]{20,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"  # AWS access key ids (long-term and temporary)
    r"|AIza[0-9A-Za-z_-]{35}"  # Google API keys
    r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"  # GitHub tokens
    r"|xox[baprs]-[A-Za-z0-9-]{10,}"  # Slack tokens
    r"|eyJ[A-Za-z0-9_-]+\.eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*"  # JWTs (header.payload.sig)
    r"|rq_[A-Za-z0-9_-]{20,}"  # recallq's own API keys
    r")(?![A-Za-z0-9_-])"
)

# A quoted value, possibly with JSON-escaped quotes (\"...\"), or else the rest of the line.
_QUOTED = r"(?P<q>\\?[\"'])[^\"'\r\n]*(?P=q)"

# "Authorization: <anything to the end of the header>", also as a JSON or dict entry.
_AUTHORIZATION = re.compile(
    r"(?P<name>\b(?:proxy-)?authorization)(?P<sep>\\?[\"']?[ \t]*[:=][ \t]*)"
    rf"(?:{_QUOTED}|[^\r\n]+)",
    re.IGNORECASE,
)

# "Bearer <token>": the token must look like one (a digit, or long), so "the bearer of the
# bond" is left alone.
_BEARER = re.compile(
    r"(?P<name>\bbearer\s+)"
    r"(?:(?=[A-Za-z0-9._~+/-]*[0-9])[A-Za-z0-9._~+/-]{8,}|[A-Za-z0-9._~+/-]{24,})=*",
    re.IGNORECASE,
)

# Names whose value is a secret. Matched on their own, so at the end of a longer name too
# (OPENAI_API_KEY, x-api-key, db.password): the longer name's head simply stays as it is.
_SECRET_NAME = (
    r"(?<![A-Za-z0-9])"
    r"(?:api[_-]?key|secret[_-]?(?:access[_-]?)?key|client[_-]?secret"
    r"|(?:access|auth|refresh|id|session|api|bearer)[_-]?token|password|passwd)"
)

# `api_key=...`, `"api_key": "..."`, `password: ...`: the name and quotes stay.
_ASSIGNMENT = re.compile(
    rf"(?P<name>{_SECRET_NAME})(?P<sep>\\?[\"']?[ \t]*[:=][ \t]*)"
    rf"(?:{_QUOTED}|[^\s\"',;&<>{{}}\[\]()]+)",
    re.IGNORECASE,
)

# scheme://user:password@host; the password runs to the authority's last "@", as an
# unencoded "@" in a password is a common mistake.
_URL_PASSWORD = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]{0,30}://[^\s:/?#@]*:)(?P<password>[^\s/?#]+)(?=@)"
)

# a secret-named query parameter in a URL: ?password=...&...
_QUERY_SECRET = re.compile(
    rf"(?P<head>[?&](?:[A-Za-z0-9_.-]{{0,40}}?[_.-])?{_SECRET_NAME}=)[^&#\s]+", re.IGNORECASE
)


def _keep_name(match: re.Match[str]) -> str:
    """The name and separator (and quotes) stay, so the text still says what was there."""
    quote = match.group("q") or ""
    return f"{match.group('name')}{match.group('sep')}{quote}{REDACTED}{quote}"


def _keep_bearer(match: re.Match[str]) -> str:
    return f"{match.group('name')}{REDACTED}"


def _structural(text: str) -> str:
    """Everything but the configured values: URLs first, so that a URL's password is not
    mistaken for the start of an assignment."""
    text = _URL_PASSWORD.sub(lambda m: f"{m.group('head')}{REDACTED}", text)
    text = _AUTHORIZATION.sub(_keep_name, text)
    text = _BEARER.sub(_keep_bearer, text)
    text = _ASSIGNMENT.sub(_keep_name, text)
    return _KEY_FORMATS.sub(REDACTED, text)


class Redactor:
    """Takes secrets out of text. Build one per process with the resolved values of the
    configured keys (every model's api_key and the like); calling it never raises."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = {
            value.strip()
            for value in secrets
            if isinstance(value, str) and len(value.strip()) >= MIN_SECRET_LENGTH
        }
        # A value that is part of the marker would redact the marker again: "[redacted]"
        # must stay a fixed point.
        values = {value for value in values if value not in REDACTED}
        # longest first: where one key contains another, the whole of the longer one goes
        ordered = sorted(values, key=lambda value: (-len(value), value))
        self._secrets = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def __call__(self, message: object) -> str:
        try:
            text = message if isinstance(message, str) else str(message)
            if self._secrets is not None:
                text = self._secrets.sub(REDACTED, text)
            return _structural(text)
        except Exception:
            # Never raise, and never hand back text that was not redacted.
            return REDACTED


def redact_url(url: str) -> str:
    """A URL fit for logs and display: the password in user:password@ and secret-named query
    parameters become ***. `postgresql+psycopg://user:secret@host/db` becomes
    `postgresql+psycopg://user:***@host/db`."""
    try:
        url = _URL_PASSWORD.sub(lambda m: f"{m.group('head')}{URL_MASK}", url)
        return _QUERY_SECRET.sub(lambda m: f"{m.group('head')}{URL_MASK}", url)
    except Exception:
        return URL_MASK


_factory_lock = threading.Lock()
_plain_factory: Callable[..., logging.LogRecord] | None = None


def _redacted_argument(redact: Redactor, value: Any) -> Any:
    """A log argument with secrets out: text is redacted; numbers, booleans and None stay
    what they are (a `%d` still formats); anything else becomes its redacted text."""
    if value is None or isinstance(value, bool | int | float):
        return value
    return redact(value)


def install_log_redaction(redact: Redactor) -> None:
    """Every log record this process makes from now on is redacted when it is made: its
    message, each of its arguments, and its traceback. Done in the record factory, so it holds
    for every logger and handler, including those a framework sets up later. The arguments
    stay arguments (formatters such as uvicorn's access log read them one by one).
    Installing again replaces the redactor."""
    global _plain_factory
    with _factory_lock:
        if _plain_factory is None:
            _plain_factory = logging.getLogRecordFactory()
        plain = _plain_factory

    def redacted_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = plain(*args, **kwargs)
        message = redact(record.msg)  # a non-string message becomes its redacted text
        if record.args and message != record.msg:
            # the format string itself held a secret (and perhaps lost a placeholder with
            # it): redact the merged message instead
            try:
                merged = record.getMessage()
            except Exception:  # a format that does not fit its arguments
                merged = str(record.msg)
            record.msg, record.args = redact(merged), None
        else:
            record.msg = message
        if isinstance(record.args, tuple):
            record.args = tuple(_redacted_argument(redact, value) for value in record.args)
        elif isinstance(record.args, dict):
            record.args = {
                key: _redacted_argument(redact, value) for key, value in record.args.items()
            }
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return record

    logging.setLogRecordFactory(redacted_record)
