"""Reading request bodies from clients that may be slow, stalled or hostile.

A body must arrive within a total time, and at a minimum rate once a grace period is over
(`body_timeout`, `body_min_rate`, `body_grace`); else 408. It is read in the event loop, so a
slow client holds no thread and no database connection while it dawdles.

- JSON bodies are read into memory up to `max_json_body_bytes` (413 beyond).
- NDJSON bodies are spooled to a temporary file (in memory up to `spool_memory_bytes`, on disk
  past it) before any database transaction starts: the transaction that stores the run then
  reads a local file, never waits on a client, and a client that gives up leaves nothing
  behind. While spooling, every limit is checked as the bytes arrive: total bytes, bytes per
  line, and lines (blank ones too: padding counts). All uploads of the process together may
  hold at most `max_spool_bytes` (503 beyond).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import IO

import anyio
from fastapi import Request
from starlette.requests import ClientDisconnect

from api.errors import HttpError
from recallq.settings import Settings

CHUNK_SPLIT = b"\n"


@dataclass(frozen=True)
class Pace:
    """How fast a body must arrive."""

    timeout: float
    min_rate: float
    grace: float

    @classmethod
    def of(cls, settings: Settings) -> Pace:
        return cls(settings.body_timeout, settings.body_min_rate, settings.body_grace)

    def allowed(self, received: int) -> float:
        """Seconds a body may have taken once `received` bytes have arrived."""
        by_rate = self.grace + received / self.min_rate if self.min_rate > 0 else self.timeout
        return min(self.timeout, by_rate)


def _too_slow(pace: Pace) -> HttpError:
    return HttpError(
        408,
        "request_timeout",
        f"the request body arrived too slowly (it must come at {pace.min_rate:g} bytes/s "
        f"after {pace.grace:g} s, and within {pace.timeout:g} s)",
    )


def too_large(limit: int, what: str = "request body") -> HttpError:
    return HttpError(413, "body_too_large", f"{what} larger than {limit} bytes")


def declared_length(request: Request) -> int | None:
    declared = request.headers.get("content-length", "")
    return int(declared) if declared.isdigit() and len(declared) < 20 else None


async def paced_chunks(request: Request, pace: Pace) -> AsyncIterator[bytes]:
    """The body's chunks, or 408 as soon as it falls behind its pace."""
    start = time.monotonic()
    received = 0
    stream = request.stream().__aiter__()
    while True:
        remaining = start + pace.allowed(received) - time.monotonic()
        if remaining <= 0:
            raise _too_slow(pace)
        chunk: bytes | None = None
        with anyio.move_on_after(remaining):
            try:
                chunk = await anext(stream, b"")
            except ClientDisconnect:
                raise HttpError(400, "client_disconnected", "the client went away") from None
            if chunk == b"":
                return
        if chunk is None:  # the wait ran out
            raise _too_slow(pace)
        received += len(chunk)
        yield chunk


async def read_json_body(request: Request, limit: int, pace: Pace) -> bytes:
    declared = declared_length(request)
    if declared is not None and declared > limit:
        raise too_large(limit, "a JSON body is")
    chunks, size = [], 0
    async for chunk in paced_chunks(request, pace):
        size += len(chunk)
        if size > limit:
            raise too_large(limit, "a JSON body is")
        chunks.append(chunk)
    return b"".join(chunks)


class SpoolBudget:
    """Bytes that all uploads of this process hold at once (used only in the event loop)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, size: int) -> bool:
        if self.used + size > self.limit:
            return False
        self.used += size
        return True

    def give_back(self, size: int) -> None:
        self.used -= size


@dataclass
class SpooledUpload:
    """An NDJSON body on disk (or in memory while small): its lines, checked as they came."""

    file: IO[bytes]
    size: int = 0
    lines: int = 0  # every line, blank ones too
    items: int = 0  # lines that are not blank
    budget: SpoolBudget | None = field(default=None, repr=False)
    _line_bytes: int = 0
    _line_blank: bool = True
    _held: int = field(default=0, repr=False)

    def lines_read(self) -> Iterator[bytes]:
        """The lines again, from the spool (for a worker thread)."""
        self.file.seek(0)
        yield from self.file

    def close(self) -> None:
        """Remove the spool and give its bytes back to the budget."""
        self.file.close()
        if self.budget is not None:
            self.budget.give_back(self._held)
        self._held = 0


def _count(upload: SpooledUpload, chunk: bytes, settings: Settings) -> None:
    """Account for a chunk: lines, items, the longest line; 413 past any limit."""
    pieces = chunk.split(CHUNK_SPLIT)
    for position, piece in enumerate(pieces):
        if position > 0:  # a newline ended the line before this piece
            upload.lines += 1
            upload.items += not upload._line_blank
            upload._line_bytes, upload._line_blank = 0, True
        upload._line_bytes += len(piece)
        if upload._line_blank and piece.strip():
            upload._line_blank = False
        if upload._line_bytes > settings.max_item_bytes:
            raise HttpError(
                413,
                "item_too_large",
                f"line {upload.lines + 1}: an NDJSON line is larger than "
                f"{settings.max_item_bytes} bytes",
            )
    # a line still open counts as soon as it has bytes: padding cannot hide
    open_line = 1 if upload._line_bytes else 0
    if upload.lines + open_line > settings.max_items_per_run:
        raise HttpError(
            413,
            "too_many_items",
            f"an NDJSON body may hold at most {settings.max_items_per_run} lines (a run holds "
            f"at most {settings.max_items_per_run} items; blank lines count)",
        )


async def spool_ndjson(request: Request, settings: Settings, budget: SpoolBudget) -> SpooledUpload:
    """Receive an NDJSON body into a spool file, checking limits as it comes (see the module
    docstring). The caller closes the upload."""
    declared = declared_length(request)
    if declared is not None and declared > settings.max_body_bytes:
        raise too_large(settings.max_body_bytes)
    # closed by the upload's close(), which the caller calls once the run is stored
    spool = tempfile.SpooledTemporaryFile(  # noqa: SIM115
        max_size=settings.spool_memory_bytes, prefix="recallq-"
    )
    upload = SpooledUpload(file=spool, budget=budget)
    try:
        async for chunk in paced_chunks(request, Pace.of(settings)):
            if not budget.take(len(chunk)):
                raise HttpError(
                    503,
                    "busy",
                    "the server is receiving as much upload data as it holds at once; retry",
                    {"Retry-After": "30"},
                )
            upload._held += len(chunk)
            upload.size += len(chunk)
            if upload.size > settings.max_body_bytes:
                raise too_large(settings.max_body_bytes)
            _count(upload, chunk, settings)
            spool.write(chunk)
        if upload._line_bytes:  # the last line had no newline
            upload.lines += 1
            upload.items += not upload._line_blank
    except BaseException:
        upload.close()
        raise
    return upload
