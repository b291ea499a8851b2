"""The one claim-cache class: its key, its prompt version, reads and writes (SQLite, as local
mode uses it; Postgres runs it through the integration tests)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine

from recallq.judge import protocol
from recallq.judge.lexical import LexicalJudge
from recallq.judge.models import LEXICAL
from recallq.state.claim_cache import ClaimCache
from recallq.state.tables import Base


@pytest.fixture()
def database() -> Iterator[Engine]:
    engine = create_engine("sqlite://")
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


def test_the_key_depends_on_project_ground_truth_model_and_prompt_version() -> None:
    key = ClaimCache.key("Ada was born in 1815.", "gpt-4o-mini", project="a")
    assert len(key) == 64
    assert key == ClaimCache.key("Ada was born in 1815.", "gpt-4o-mini", project="a")
    others = {
        ClaimCache.key("Ada was born in 1815.", "gpt-4o-mini", project="b"),
        ClaimCache.key("Ada was born in 1816.", "gpt-4o-mini", project="a"),
        ClaimCache.key("Ada was born in 1815.", "gpt-4o", project="a"),
        ClaimCache.key("Ada was born in 1815.", LEXICAL, project="a"),
    }
    assert key not in others and len(others) == 4


def test_one_prompt_version_per_kind_of_judge() -> None:
    assert ClaimCache.prompt_version(LEXICAL) == LexicalJudge.prompt_version
    assert ClaimCache.prompt_version("any-llm") == protocol.PROMPT_VERSION


def test_a_write_keeps_the_first_entry_and_reads_find_only_what_is_there(
    database: Engine,
) -> None:
    keys = [ClaimCache.key(f"fact {n}", "m", project="p") for n in range(2500)]
    with database.begin() as conn:
        for n, key in enumerate(keys[:1500]):
            ClaimCache.write(conn, key, [f"claim {n}"])
        ClaimCache.write(conn, keys[0], ["a second write changes nothing"])
    with database.connect() as conn:
        found = ClaimCache.read(conn, keys + keys[:10])  # chunked past 1000 keys, repeats
    assert len(found) == 1500
    assert found[keys[0]] == ["claim 0"] and found[keys[1499]] == ["claim 1499"]
    assert keys[1500] not in found
    with database.connect() as conn:
        assert ClaimCache.read(conn, []) == {}
