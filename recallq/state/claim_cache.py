"""The claim cache: claims extracted for a ground truth by a model and prompt version, reused
by later runs of the same project instead of another extraction call.

One class owns the key, the prompt version it is keyed by, reads and writes; the online
engine, the batch lane, the estimate and the API's queries all go through it. Only claims that
passed the judge-answer checks (recallq.judge.protocol) are written here: a poisoned entry
would be handed to every later run of that ground truth.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from functools import lru_cache
from typing import cast

from sqlalchemy import Connection, Table, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import Insert

from recallq.judge import protocol
from recallq.judge.lexical import LexicalJudge
from recallq.judge.models import LEXICAL
from recallq.state.tables import ClaimCache as ClaimCacheRow

_table = cast(Table, ClaimCacheRow.__table__)
# keys per IN (...) list: well under every driver's parameter limit
_READ_CHUNK = 1000


@lru_cache
def _insert(dialect: str) -> Insert:
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    return insert(_table).on_conflict_do_nothing()


class ClaimCache:
    """Keys, reads and writes of the claim_cache table. Stateless: every method takes the
    connection (or session) of the caller's transaction."""

    @staticmethod
    def prompt_version(model: str) -> str:
        """What the cache is keyed by besides the ground truth and the model: the offline
        judge's version, or the LLM judge protocol's."""
        return LexicalJudge.prompt_version if model == LEXICAL else protocol.PROMPT_VERSION

    @classmethod
    def key(cls, ground_truth: str, model: str, *, project: str) -> str:
        """The cache key. It includes the project: a hit must never tell one project that
        another scored the same ground truth (or hand it the claims extracted there)."""
        version = cls.prompt_version(model)
        payload = json.dumps([project, ground_truth, model, version], ensure_ascii=False)
        return hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()

    @staticmethod
    def read(conn: Connection | Session, keys: Sequence[str]) -> dict[str, list[str]]:
        """The claims held for those of these keys the cache has."""
        found: dict[str, list[str]] = {}
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), _READ_CHUNK):
            chunk = unique[start : start + _READ_CHUNK]
            rows = conn.execute(
                select(_table.c.key, _table.c.claims).where(_table.c.key.in_(chunk))
            )
            found.update({key: list(claims) for key, claims in rows})
        return found

    @staticmethod
    def write(conn: Connection, key: str, claims: Sequence[str]) -> None:
        """Keep freshly extracted (and checked) claims; an entry already there stays."""
        conn.execute(_insert(conn.dialect.name), [{"key": key, "claims": list(claims)}])
