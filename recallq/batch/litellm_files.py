"""The litellm adapter for a provider's Files and Batch APIs: the calls of the batch lane.

Importing this module imports litellm (about 6 s of CPU): only the lane's poller does, in a
worker. `BatchAPI` is what the lane needs: upload an input file, create a batch carrying our
own id as metadata, find a batch by that metadata (a create whose answer was lost to a crash),
retrieve, cancel, and read an output or error file. The OpenAI SDK's own retries are off: a
failed call is simply made again at the lane's next poll. Errors come back as
TransientJudgeError (try again at the next poll) or PermanentJudgeError (the provider refuses
for good), their text cleared of the model's key and anything shaped like a credential.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from recallq import patches
from recallq.batch.provider import ENDPOINT, BatchInfo, is_transient
from recallq.core.errors import PermanentJudgeError, TransientJudgeError
from recallq.core.redact import Redactor
from recallq.judge.models import ModelConfig

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch at import

import litellm  # after the variable above

#: litellm_params that say where the provider is and who calls it (the rest shape requests).
CONNECTION_PARAMS = ("api_base", "api_key", "api_version", "organization")
COMPLETION_WINDOW = "24h"
LIST_PAGE = 100
T = TypeVar("T")


class LitellmBatchAPI:
    """A model's provider Batch API through litellm (OpenAI's format: OpenAI, Azure, and
    servers that speak it)."""

    def __init__(self, config: ModelConfig, timeout: float) -> None:
        patches.prepare_litellm()
        params = config.resolved_params()
        self.body_params = params
        try:
            self.body_model, self._provider, _, _ = litellm.get_llm_provider(params["model"])
        except Exception as exc:  # litellm raises its own kinds for this
            raise PermanentJudgeError(f"model {config.name!r}: {exc}") from exc
        self._call_params: dict[str, Any] = {
            "custom_llm_provider": self._provider,
            "timeout": timeout,
            "max_retries": 0,
            **{key: params[key] for key in CONNECTION_PARAMS if key in params},
        }
        self._redact = Redactor([str(v) for v in params.values() if isinstance(v, str)])

    def upload(self, filename: str, content: bytes) -> str:
        created = self._call(
            litellm.create_file, file=(filename, content), purpose="batch", **self._call_params
        )
        return str(created.id)

    def create(self, input_file_id: str, metadata: dict[str, str]) -> BatchInfo:
        batch = self._call(
            litellm.create_batch,
            completion_window=COMPLETION_WINDOW,
            endpoint=ENDPOINT,
            input_file_id=input_file_id,
            metadata=metadata,
            **self._call_params,
        )
        return _info(batch)

    def find(self, key: str, value: str, since: float) -> BatchInfo | None:
        """The batch whose metadata maps `key` to `value`, looking back (newest first) to
        batches created at `since` (unix seconds)."""
        for batch in self._batches_since(since):
            if batch.metadata.get(key) == value:
                return batch
        return None

    def _batches_since(self, since: float) -> Iterator[BatchInfo]:
        after: str | None = None
        while True:
            page = self._call(
                litellm.list_batches, after=after, limit=LIST_PAGE, **self._call_params
            )
            batches = [_info(batch) for batch in getattr(page, "data", None) or []]
            for batch in batches:
                if batch.created_at and batch.created_at < since:
                    return
                yield batch
            if not batches or not getattr(page, "has_more", False):
                return
            after = batches[-1].id

    def retrieve(self, batch_id: str) -> BatchInfo:
        return _info(self._call(litellm.retrieve_batch, batch_id=batch_id, **self._call_params))

    def cancel(self, batch_id: str) -> BatchInfo:
        return _info(self._call(litellm.cancel_batch, batch_id=batch_id, **self._call_params))

    def content(self, file_id: str) -> bytes:
        response = self._call(litellm.file_content, file_id=file_id, **self._call_params)
        return bytes(response.content)

    def _call(self, function: Callable[..., T], **kwargs: Any) -> T:
        """One provider call; its error as the lane's kind of error, redacted."""
        try:
            with patches.without_litellm_callbacks():
                return function(**kwargs)
        except Exception as exc:  # the SDK's and litellm's kinds both occur
            status = getattr(exc, "status_code", None)
            status = status if isinstance(status, int) else None
            message = self._redact(f"{type(exc).__name__}: {_first_line(exc)}")
            if is_transient(status):
                raise TransientJudgeError(message, f"provider error ({status})") from exc
            raise PermanentJudgeError(message) from exc


def _first_line(exc: Exception) -> str:
    message = str(getattr(exc, "message", None) or exc)
    return message.split("\n", 1)[0][:300]


def _info(batch: Any) -> BatchInfo:
    counts = getattr(batch, "request_counts", None)
    metadata = getattr(batch, "metadata", None)
    errors = [getattr(e, "message", None) for e in getattr(batch.errors, "data", None) or []]
    return BatchInfo(
        id=str(batch.id),
        status=str(batch.status),
        output_file_id=getattr(batch, "output_file_id", None),
        error_file_id=getattr(batch, "error_file_id", None),
        total=int(getattr(counts, "total", 0) or 0),
        completed=int(getattr(counts, "completed", 0) or 0),
        failed=int(getattr(counts, "failed", 0) or 0),
        created_at=int(getattr(batch, "created_at", 0) or 0),
        metadata=dict(metadata) if isinstance(metadata, dict) else {},
        errors="; ".join(str(e) for e in errors if e)[:500] or None,
    )
