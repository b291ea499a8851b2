"""Result streams that hold a bounded number of bytes ahead of their reader.

A stream renders a run's items a page at a time, each page read in its own short transaction
and cut by bytes: after each page the next one is sized to about `PAGE_BYTES` at the bytes
per item seen so far (from 1 to `MAX_PAGE_ITEMS` items). The page is handed to the server in
slices of `SLICE_BYTES`, and each slice waits until the server's write buffer has drained, so
a reader that stops reading holds one page and one slice in the API's memory, not a whole
run. (A 500-item page of a 50 MB run was 8 MB pinned per stalled reader before.)

Each key may have `max_result_streams_per_key` streams open at once in one API process (429
beyond): a client cannot hold more of the API's memory and connections by opening more; and a
stream whose reader takes nothing for `results_stall_timeout` seconds ends, giving its slot
back.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import anyio.to_thread
from fastapi.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from api.errors import HttpError

log = logging.getLogger(__name__)
PAGE_BYTES = 512 * 1024
SLICE_BYTES = 64 * 1024
FIRST_PAGE_ITEMS = 20
MAX_PAGE_ITEMS = 500

#: renders the page of at most `limit` items after the index `after` (None: the first);
#: returns its bytes, how many items it had, and the index of its last item when more follow
RenderPage = Callable[[int | None, int, bool], tuple[bytes, int, int | None]]


class StreamSlots:
    """Streams open per key in this process (used only in the event loop)."""

    def __init__(self, per_key: int) -> None:
        self.per_key = per_key
        self.open: dict[str, int] = {}

    def take(self, key: str) -> None:
        """One more stream for `key`, or 429."""
        if self.per_key > 0 and self.open.get(key, 0) >= self.per_key:
            raise HttpError(
                429,
                "too_many_streams",
                f"this key has {self.per_key} result streams open already; finish one first",
                {"Retry-After": "10"},
            )
        self.open[key] = self.open.get(key, 0) + 1

    def give_back(self, key: str) -> None:
        left = self.open.get(key, 0) - 1
        if left > 0:
            self.open[key] = left
        else:
            self.open.pop(key, None)


def next_page_items(page_bytes: int, items: int) -> int:
    """How many items the next page should have, after a page of `items` items and
    `page_bytes` bytes."""
    if items <= 0 or page_bytes <= 0:
        return MAX_PAGE_ITEMS
    return max(1, min(MAX_PAGE_ITEMS, PAGE_BYTES * items // page_bytes))


async def paged_bytes(render: RenderPage) -> AsyncIterator[bytes]:
    """Every page `render` makes, rendered in a worker thread, in slices."""
    after: int | None = None
    limit = FIRST_PAGE_ITEMS
    first = True
    while True:
        body, count, after = await anyio.to_thread.run_sync(render, after, limit, first)
        first = False
        size = len(body)
        for start in range(0, size, SLICE_BYTES):
            yield body[start : start + SLICE_BYTES]
        del body  # not held while the reader takes its time over the next page's wait
        if after is None:
            return
        limit = next_page_items(size, count)


class SlottedStream(StreamingResponse):
    """A streaming response that gives its key's slot back however it ends (done, the client
    gone, an error), and ends when its reader takes nothing for `stall_timeout` seconds (a
    slice waits for the socket to drain: a reader slower than about a slice per timeout)."""

    def __init__(
        self, slots: StreamSlots, key: str, stall_timeout: float, *args: Any, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._slots, self._key, self._stall_timeout = slots, key, stall_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_or_give_up(message: Message) -> None:
            with anyio.fail_after(self._stall_timeout):
                await send(message)

        try:
            await super().__call__(scope, receive, send_or_give_up)
        except TimeoutError:
            # the response cannot be finished: the server closes the connection
            log.warning(
                "a /results reader took nothing for %g s; its stream ends", self._stall_timeout
            )
        finally:
            self._slots.give_back(self._key)
