"""Reading request bodies within size limits, and NDJSON as a stream of lines."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import anyio.from_thread
from fastapi import Request
from starlette.requests import ClientDisconnect

from recallq.ingest import SubmissionError


def _too_large(limit: int) -> SubmissionError:
    return SubmissionError(f"request body larger than {limit} bytes", "body_too_large", 413)


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def blocking_lines(
    stream: AsyncIterator[bytes], body_limit: int, line_limit: int
) -> Iterator[bytes]:
    """Lines of an async byte stream, for a worker thread (pulls chunks through the event loop)."""

    async def next_chunk() -> bytes | None:
        try:
            return await stream.__anext__()
        except StopAsyncIteration:
            return None
        except ClientDisconnect:
            # a client that stopped mid-upload (recallq.Client stops at the first bad item it
            # reads): nothing is stored, and nobody is left to answer, so no traceback either
            raise SubmissionError(
                "the client disconnected before the body ended", "client_disconnected", 400
            ) from None

    buffer, size = b"", 0
    while (chunk := anyio.from_thread.run(next_chunk)) is not None:
        size += len(chunk)
        if size > body_limit:
            raise _too_large(body_limit)
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        yield from lines
        if len(buffer) > line_limit:
            raise SubmissionError(
                f"an NDJSON line is larger than {line_limit} bytes", "item_too_large", 413
            )
    if buffer:
        yield buffer
