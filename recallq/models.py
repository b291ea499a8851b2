"""Tables: runs, their items, one row per extracted claim with its verdict, the claim cache,
and the API keys that say which project a request acts in."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
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

from recallq.status import ItemStatus, RunStatus

# Integer on SQLite so the primary key is its rowid (autoincrement); BIGINT elsewhere.
BigId = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """SQLite hands back naive datetimes (stored as UTC); Postgres aware ones."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {datetime: DateTime(timezone=True), dict[str, Any]: JSON}


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (UniqueConstraint("project", "idempotency_key", name="uq_runs_idempotency"),)

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
    # spend control: once the run's recorded usage reaches either, no new judge call starts
    budget_usd: Mapped[float | None] = mapped_column(Float)
    budget_tokens: Mapped[int | None] = mapped_column(BigInteger)
    # why a cancelled run was cancelled: "user" or "budget"
    cancel_reason: Mapped[str | None] = mapped_column(String(16))
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
