"""Tables: runs, their items, one row per extracted claim with its verdict, the claim cache,
the kept views of completed runs, the API keys that say which project a request acts in, and
the provider batches of batch-mode runs with their request lines; the human labels of
claims with the random samples drawn for labelling; the usage charges written late."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from recallq.core.status import ItemStatus, RunStatus

# Integer on SQLite so the primary key is its rowid (autoincrement); BIGINT elsewhere.
BigId = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """SQLite hands back naive datetimes (stored as UTC); Postgres aware ones."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {datetime: DateTime(timezone=True), dict[str, Any]: JSON}


class RunMode(StrEnum):
    """How a run's judge calls reach the provider."""

    #: One chat-completion call at a time, by the workers' stages (recallq.execution.engine).
    ONLINE = "online"
    #: Through the provider's Batch API, by the provider batch lane (recallq.batch.lane).
    BATCH = "batch"


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        UniqueConstraint("project", "idempotency_key", name="uq_runs_idempotency"),
        # a project's runs, newest first (GET /v1/runs, `recallq runs`)
        Index("ix_runs_project_created", "project", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    project: Mapped[str] = mapped_column(String(64), default="default", index=True)
    name: Mapped[str | None] = mapped_column(String(200))
    model: Mapped[str] = mapped_column(String(200))
    scale: Mapped[float] = mapped_column(Float, default=1.0)
    status: Mapped[str] = mapped_column(String(16), default=RunStatus.QUEUED)
    context: Mapped[list[str] | None] = mapped_column(JSON)
    context_extractor: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    total_items: Mapped[int] = mapped_column(Integer, default=0)
    # how long an item may wait out a provider incident before it fails (None: the setting)
    retry_deadline_s: Mapped[float | None] = mapped_column(Float)
    mode: Mapped[str] = mapped_column(String(8), default=RunMode.ONLINE, server_default="online")
    # spend control: once the run's recorded usage reaches either, no new judge call starts
    budget_usd: Mapped[float | None] = mapped_column(Float)
    budget_tokens: Mapped[int | None] = mapped_column(BigInteger)
    # why a cancelled run was cancelled: "user" or "budget"
    cancel_reason: Mapped[str | None] = mapped_column(String(16))
    # how its items' passages are known relevant: cited | judged | off (migration 0012)
    precision: Mapped[str] = mapped_column(String(8), default="cited", server_default="cited")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class Item(Base):
    __tablename__ = "items"
    __table_args__ = (
        UniqueConstraint("run_id", "idx", name="uq_items_run_idx"),
        UniqueConstraint("run_id", "key", name="uq_items_run_key"),
        # paging by status and status counts of one run
        Index("ix_items_run_status_idx", "run_id", "status", "idx"),
        # the web pages' items table by score (migration 0007)
        Index("ix_items_run_score_idx", "run_id", "score", "idx"),
        # two runs compared: items paired by key, read from the index alone (migration 0008)
        Index(
            "ix_items_run_key_scores",
            "run_id",
            "key",
            postgresql_include=["status", "score", "id"],
        ),
        # the reaper's scan for items whose worker vanished
        Index("ix_items_status_lease", "status", "lease_until"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    idx: Mapped[int] = mapped_column(Integer)
    key: Mapped[str] = mapped_column(String(200))  # the client's item id
    input: Mapped[Any | None] = mapped_column(JSON)
    output: Mapped[Any | None] = mapped_column(JSON)
    ground_truth: Mapped[str | None] = mapped_column(Text)
    # resolved at submission; None: the run's static context (stored once, on the run)
    contexts: Mapped[list[str] | None] = mapped_column(JSON)
    # the submitted record's other fields (recallq.runs.dataset); `metadata` is taken on the class
    item_metadata: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON)
    status: Mapped[str] = mapped_column(String(16), default=ItemStatus.PENDING)
    score: Mapped[float | None] = mapped_column(Float)
    claims_total: Mapped[int | None] = mapped_column(Integer)
    claims_attributed: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    llm_calls: Mapped[int] = mapped_column(Integer, default=0)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    cache_hits: Mapped[int] = mapped_column(Integer, default=0)
    call_attempts: Mapped[int] = mapped_column(Integer, default=0)  # requests sent
    failed_calls: Mapped[int] = mapped_column(Integer, default=0)  # sent, answered with an error
    deferrals: Mapped[int] = mapped_column(Integer, default=0)  # put back to wait for capacity
    # of the usage above, what claim extraction used (attribution used the rest)
    extraction_calls: Mapped[int] = mapped_column(Integer, default=0)
    extraction_prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    extraction_completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    extraction_cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    # of the usage above, what the context_relevance call used (precision "judged")
    relevance_calls: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    relevance_prompt_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    relevance_completion_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    relevance_cost_usd: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    # context precision (recallq.core.precision): null with no context or no ground truth
    context_precision: Mapped[float | None] = mapped_column(Float)
    first_relevant_rank: Mapped[int | None] = mapped_column(Integer)
    # [{index, relevant, claims, reason}], one per passage in retrieved order
    passages: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    # from retrieved_context_ids / reference_context_ids, at submission (no call)
    id_precision: Mapped[float | None] = mapped_column(Float)
    id_recall: Mapped[float | None] = mapped_column(Float)
    # since when it waits out a provider incident (reset when it makes progress)
    waiting_since: Mapped[datetime | None]
    lease_until: Mapped[datetime | None]
    owner: Mapped[str | None] = mapped_column(String(120))  # worker id + token while running
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class Claim(Base):
    __tablename__ = "claims"
    __table_args__ = (UniqueConstraint("item_id", "idx", name="uq_claims_item_idx"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    item_id: Mapped[int] = mapped_column(ForeignKey("items.id", ondelete="CASCADE"))
    idx: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    verdict: Mapped[str | None] = mapped_column(String(3))  # null until attributed
    context_indices: Mapped[list[int] | None] = mapped_column(JSON)
    reason: Mapped[str | None] = mapped_column(Text)


class ClaimCache(Base):
    """Claims extracted for a ground truth by a model and prompt version, reused across runs."""

    __tablename__ = "claim_cache"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 hex
    claims: Mapped[list[str]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class KeptView(Base):
    """A view of completed runs (a run object's aggregates, a group summary, a comparison),
    computed once and kept by recallq.state.kept: a completed run's items no longer change."""

    __tablename__ = "kept_views"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 hex
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    other_run_id: Mapped[str | None] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), index=True
    )
    body: Mapped[Any] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class BrokerEpoch(Base):
    """The broker's epoch as the reaper last saw it: Redis's `run_id` then, also kept in a
    Redis key. A Redis that lost its data lacks that key whoever starts first, while this row
    survives in Postgres (see recallq.execution.broker_epoch.BrokerEpochs)."""

    __tablename__ = "broker_epoch"

    name: Mapped[str] = mapped_column(String(16), primary_key=True)
    token: Mapped[str] = mapped_column(String(64))
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class UsageCharge(Base):
    """A charge counted: the usage of answered judge calls that a stage's end added to its item
    (recorded by that write), or that the spool (recallq.state.usage_spool) wrote later because
    the database did not take it then. Keyed by the charge id, so that writing a charge again
    (the spool's copy of a write whose answer was lost, a flush whose commit was lost, two
    workers flushing) never counts it twice."""

    __tablename__ = "usage_charges"

    charge_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    # deleted with its item (and so with its run)
    item_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("items.id", ondelete="CASCADE"), index=True
    )
    run_id: Mapped[str] = mapped_column(String(36))
    stage: Mapped[str] = mapped_column(String(16))
    llm_calls: Mapped[int] = mapped_column(Integer, default=0)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    call_attempts: Mapped[int] = mapped_column(Integer, default=0)
    failed_calls: Mapped[int] = mapped_column(Integer, default=0)
    answered_at: Mapped[datetime]  # when the write that counts it was made
    written_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiKey(Base):
    """A bearer key of a project. Only its SHA-256 is kept: a key is 32 random bytes, so a
    slow hash would add nothing, and a stolen table gives no usable key."""

    __tablename__ = "api_keys"
    __table_args__ = (UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    project: Mapped[str] = mapped_column(String(64), index=True)
    role: Mapped[str] = mapped_column(String(8))  # read | write | admin
    label: Mapped[str | None] = mapped_column(String(200))
    key_hash: Mapped[str] = mapped_column(String(64))  # sha256 hex of the key
    prefix: Mapped[str] = mapped_column(String(16))  # its first characters, to tell keys apart
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]


# --- the provider batch lane (recallq.batch.lane) ------------------------------------------


class ProviderBatch(Base):
    """One provider batch of a batch-mode run: our id (sent to the provider as metadata, so a
    batch created by a call whose answer was lost is found again), the state of its way
    through the provider (recallq.batch.store.BatchState) and the provider's ids."""

    __tablename__ = "provider_batches"
    __table_args__ = (Index("ix_provider_batches_state", "state"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    # SET NULL, not CASCADE: a deleted run's batch still has to be cancelled at the provider
    run_id: Mapped[str | None] = mapped_column(
        ForeignKey("runs.id", ondelete="SET NULL"), index=True
    )
    model: Mapped[str] = mapped_column(String(200))
    stage: Mapped[str] = mapped_column(String(16))  # extraction | attribution
    state: Mapped[str] = mapped_column(String(16))
    provider_status: Mapped[str | None] = mapped_column(String(32))
    provider_batch_id: Mapped[str | None] = mapped_column(String(200))
    input_file_id: Mapped[str | None] = mapped_column(String(200))
    output_file_id: Mapped[str | None] = mapped_column(String(200))
    error_file_id: Mapped[str | None] = mapped_column(String(200))
    requests: Mapped[int] = mapped_column(Integer, default=0)
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    completed: Mapped[int] = mapped_column(Integer, default=0)  # as the provider counts them
    failed: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    # since when sending it fails for a transient reason (its items' retry deadline runs)
    waiting_since: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    creating_at: Mapped[datetime | None]  # when the create call may have gone out
    submitted_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class BatchLine(Base):
    """One request of the batch lane: an item's extraction or attribution call. It is `ready`
    until a batch takes it, `sent` while in one, then `answered`, `failed` or `dropped`; a
    request that must go again (a failed line, a repair, a re-ask) is a new line, so a
    custom_id (`rq-<id>`) is never sent twice."""

    __tablename__ = "batch_lines"
    __table_args__ = (
        Index("ix_batch_lines_run_state", "run_id", "state"),
        Index("ix_batch_lines_batch", "batch_id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    item_id: Mapped[int] = mapped_column(ForeignKey("items.id", ondelete="CASCADE"), index=True)
    batch_id: Mapped[str | None] = mapped_column(
        ForeignKey("provider_batches.id", ondelete="SET NULL")
    )
    stage: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(12))
    # attribution: the claims asked (None: all); a re-ask asks those left without a verdict
    claim_indices: Mapped[list[int] | None] = mapped_column(JSON)
    reask: Mapped[bool] = mapped_column(Boolean, default=False)
    # what this request carries over from earlier ones: the verdicts a re-ask keeps, and for
    # a repair request the malformed answer and what was wrong with it
    carry: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


# --- human labels (recallq.labels) ----------------------------------------------------------------


class ClaimLabel(Base):
    """A person's verdict on one claim of an item: whether the context supports it. Kept
    apart from the judge's verdict (claims.verdict), which it never changes."""

    __tablename__ = "claim_labels"
    __table_args__ = (
        UniqueConstraint("item_id", "claim_idx", name="uq_claim_labels_item_claim"),
        Index("ix_claim_labels_run", "run_id", "item_id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    item_id: Mapped[int] = mapped_column(ForeignKey("items.id", ondelete="CASCADE"))
    claim_idx: Mapped[int] = mapped_column(Integer)
    verdict: Mapped[str] = mapped_column(String(3))  # yes | no
    note: Mapped[str | None] = mapped_column(Text)
    labelled_by: Mapped[str | None] = mapped_column(String(32))  # the key's id (None: auth off)
    labelled_at: Mapped[datetime] = mapped_column(default=utcnow)


class LabelSample(Base):
    """The random sample of a run's items drawn for labelling (its seed and item ids, in the
    order drawn): labels on these items are a uniform sample, so they may correct the mean."""

    __tablename__ = "label_samples"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    seed: Mapped[int] = mapped_column(BigInteger)
    item_keys: Mapped[list[str]] = mapped_column(JSON)
    drawn_by: Mapped[str | None] = mapped_column(String(32))
    drawn_at: Mapped[datetime] = mapped_column(default=utcnow)
