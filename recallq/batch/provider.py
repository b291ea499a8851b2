"""A provider's Batch API as the batch lane uses it: the batch it reads (BatchInfo), the calls
it makes (BatchAPI, implemented through litellm by recallq.batch.litellm_files), the endpoint its
request lines name, and which HTTP statuses of a line are worth another try. No I/O, no
litellm: the lane's pure parts (recallq.batch.requests) name these too."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

ENDPOINT = "/v1/chat/completions"


def is_transient(status: int | None) -> bool:
    """Whether a provider's HTTP status is worth another try, as online (the direct lane,
    recallq.judge.openai_compatible): 429, 408, 409, 5xx, and no status at all (the request
    was never run)."""
    return status is None or status in (408, 409, 429) or status >= 500


#: Batch statuses after which a batch changes no more.
FINAL = frozenset({"completed", "failed", "expired", "cancelled"})


@dataclass(frozen=True)
class BatchInfo:
    """A provider batch as the lane reads it."""

    id: str
    status: str
    output_file_id: str | None = None
    error_file_id: str | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    created_at: int = 0
    metadata: dict[str, str] = field(default_factory=dict)
    errors: str | None = None  # why the provider failed the whole batch, if it did

    @property
    def final(self) -> bool:
        return self.status in FINAL


class BatchAPI(Protocol):
    """One model's provider Batch API."""

    #: the model name request bodies carry (litellm_params.model without its provider prefix)
    body_model: str
    #: litellm_params that request bodies carry (see recallq.batch.requests.BODY_PARAMS)
    body_params: dict[str, Any]

    def upload(self, filename: str, content: bytes) -> str: ...

    def create(self, input_file_id: str, metadata: dict[str, str]) -> BatchInfo: ...

    def find(self, key: str, value: str, since: float) -> BatchInfo | None: ...

    def retrieve(self, batch_id: str) -> BatchInfo: ...

    def cancel(self, batch_id: str) -> BatchInfo: ...

    def content(self, file_id: str) -> bytes: ...
