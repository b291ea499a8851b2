"""A stage's end that Postgres committed but whose answer never came back (the link broke on
the way back): the worker cannot tell it from a write the database never took, so it keeps the
usage as charges in the spool; the write recorded those same charges, so writing the spool
later counts nothing more. Real Postgres, the store's own statements, and a TCP relay between
them that lets one statement through and drops its answer and the connection.
"""

from __future__ import annotations

import select as selecting
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
from sqlalchemy import select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from recallq.core.outcomes import Stage, Taken
from recallq.core.scoring import Outcome
from recallq.core.usage import Usage
from recallq.runs.ingest import build_spec, create_run
from recallq.settings import Settings
from recallq.state.db import Database
from recallq.state.items import ItemStore
from recallq.state.runs import stores_for
from recallq.state.tables import Item

USED = Usage(llm_calls=1, prompt_tokens=100, completion_tokens=20, cost_usd=0.5, call_attempts=1)
#: The pass's owner token: every write of its stage's end is guarded by it.
OWNER = "w1/lost-answer"
#: Postgres's ReadyForQuery, idle: the end of the answer to a statement in autocommit.
READY = b"Z\x00\x00\x00\x05I"


class Relay:
    """Client ↔ Postgres, byte for byte, until `drop_next_answer()`: then the next statement
    carrying the pass's OWNER token goes through, and its answer (the commit done) is swallowed and
    the connection closed under the client."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._armed = threading.Event()
        self.dropped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def drop_next_answer(self) -> None:
        self.dropped.clear()
        self._armed.set()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._target)
            threading.Thread(target=self._pipe, args=(client, server), daemon=True).start()

    def _pipe(self, client: socket.socket, server: socket.socket) -> None:
        swallowing = False
        swallowed = b""
        try:
            while True:
                ready, _, _ = selecting.select([client, server], [], [])
                if client in ready:
                    data = client.recv(65536)
                    if not data:
                        return
                    if self._armed.is_set() and OWNER.encode() in data:
                        self._armed.clear()
                        swallowing = True
                    server.sendall(data)
                if server in ready:
                    data = server.recv(65536)
                    if not data:
                        return
                    if not swallowing:
                        client.sendall(data)
                        continue
                    swallowed += data
                    if swallowed.endswith(READY):  # committed: the answer is lost
                        self.dropped.set()
                        return
        except OSError:
            return
        finally:
            client.close()
            server.close()


@pytest.fixture()
def relay(pg_database: str) -> Iterator[Relay]:
    url = make_url(pg_database)
    started = Relay(url.host or "127.0.0.1", url.port or 5432)
    yield started
    started.close()


@pytest.fixture()
def store(pg_database: str, relay: Relay) -> Iterator[tuple[ItemStore, Database]]:
    """The item store of a worker that reaches Postgres through the relay (its spool in
    memory), and the database reached directly, to look."""
    relayed_url = make_url(pg_database).set(host="127.0.0.1", port=relay.port)
    relayed = Database(relayed_url.render_as_string(hide_password=False))
    direct = Database(pg_database)
    items, _ = stores_for(relayed, Settings(database_url=pg_database))
    yield items, direct
    relayed.dispose()
    direct.dispose()


def _taken(items: ItemStore, direct: Database) -> Taken:
    settings = Settings(database_url=direct.url)
    _, runs = stores_for(direct, settings)
    spec = build_spec(model="local/lexical", known_models=["local/lexical"])
    rows = [{"ground_truth": "Ada was born in 1815.", "context": ["Ada: 1815."]}]
    with direct.session() as session:
        run_id = create_run(session, runs, spec, rows, settings).id
    assert runs.release_window(run_id)
    with direct.session() as session:
        item_id = session.scalars(select(Item.id).where(Item.run_id == run_id)).one()
    taken = items.take(item_id, OWNER, lambda holder: False)
    assert isinstance(taken, Taken)
    return taken


def _calls(direct: Database, item_id: int) -> tuple[int, int]:
    with direct.session() as session:
        item = session.get(Item, item_id)
        assert item is not None
        return item.llm_calls, item.prompt_tokens


ENDS: dict[str, Callable[[ItemStore, Taken], object]] = {
    "extraction's end": lambda items, taken: items.save_claims(
        taken, ["Ada was born in 1815."], USED, False, "lost-answer-key"
    ),
    "an item's end": lambda items, taken: items.succeed(
        replace(taken, claims=("Ada was born in 1815.",)),
        Outcome(1.0, 1, 1, "ok"),
        USED,
        Stage.ATTRIBUTION,
    ),
    "a deferral": lambda items, taken: items.defer(taken, 5.0, USED, Stage.ATTRIBUTION, None),
}


@pytest.mark.parametrize("end", ENDS, ids=list(ENDS))
def test_a_committed_write_whose_answer_was_lost_counts_its_usage_once(
    store: tuple[ItemStore, Database], relay: Relay, end: str
) -> None:
    items, direct = store
    taken = _taken(items, direct)
    relay.drop_next_answer()
    with pytest.raises(SQLAlchemyError):
        ENDS[end](items, taken)
    assert relay.dropped.is_set(), "the relay let the answer through"
    assert _calls(direct, taken.item_id) == (1, 100)  # committed: counted by the write
    kept = items.spool.pending()
    assert [c.usage for c in kept] == [USED], "the worker could not know: it kept the usage"

    assert items.write_spooled() == 1  # flushed, and dropped from the spool
    assert items.spool.pending() == []
    assert _calls(direct, taken.item_id) == (1, 100)  # the write recorded that very charge
