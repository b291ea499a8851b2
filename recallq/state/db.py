"""A database: its engine and the three ways recallq talks to it.

- `session()`: an ORM session in one transaction (reads of the API, submissions);
- `transaction()`: one Core transaction (the store's writes that must be atomic together);
- `single_statement()`: one Core statement that is atomic on its own (the store's hot path).

SQLite (local mode) is tuned so the threads of an in-process runner can share one file.

`ping()` is one round trip, for a process about to start (`recallq api`, `recallq worker`: a
database that does not exist or cannot be reached is one line and exit 2, before "ready.") and
for a worker watching an outage end (worker.outages).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

#: Seconds a new Postgres connection may take (libpq's connect_timeout): a host that drops
#: packets is an error after this, not a process hanging on the system's TCP timeout.
CONNECT_TIMEOUT = 10


class DatabaseUnavailable(Exception):
    """The database cannot be used now: it does not exist, or it cannot be reached. Its text
    is the driver's reason on one line."""

    @property
    def missing(self) -> bool:
        """The server answered, and the database is not there (create it, then migrate)."""
        return "does not exist" in str(self)


def _reason(exc: OperationalError | InterfaceError) -> str:
    """The driver's message on one line, without the statement Postgres quotes under it."""
    message = str(exc.orig).split("\nLINE ")[0] if exc.orig is not None else str(exc)
    return " ".join(message.split()) or type(exc.orig or exc).__name__


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def make_engine(url: str, pre_ping: bool = True, idle_transaction_timeout: float = 0) -> Engine:
    """An engine for `url`. Workers pass pre_ping=False: no liveness ping (a round trip) before
    each transaction. A connection that died with a database restart then fails its
    statement instead, SQLAlchemy discards the whole pool, and the task hands its message
    back (see worker.tasks).

    Workers also pass `idle_transaction_timeout` (seconds; 0: none): Postgres ends a session
    whose transaction waited that long for its next statement. A worker's transactions never
    wait on anything but the database, so only a client that is gone leaves one idle: a host
    that vanished or was cut off mid-transaction. Without it, Postgres keeps that session,
    and the rows it locked, until the system's TCP keepalive finds the host dead (two
    hours), and the reaper, which skips locked rows, cannot requeue them (tests/multihost).
    Not for the API: a submission's transaction waits for a slow client's upload.

    The same bound covers a session stopped mid-statement, which that timeout does not see:
    Postgres waiting for the rest of a message the host never finished sending (keepalive
    probes, unanswered, end it) or for the host to take a result (`tcp_user_timeout`)."""
    # hide_parameters: an error's text (logged) never carries the values a client sent
    if not is_sqlite(url):
        timeout_ms = round(idle_transaction_timeout * 1000)
        connect_args: dict[str, object] = {}
        if "connect_timeout=" not in url:  # the URL's own wins
            connect_args["connect_timeout"] = CONNECT_TIMEOUT
        if timeout_ms:
            probe_s = max(1, round(idle_transaction_timeout / 6))
            connect_args["options"] = " ".join(
                (
                    f"-c idle_in_transaction_session_timeout={timeout_ms}",
                    f"-c tcp_keepalives_idle={probe_s}",
                    f"-c tcp_keepalives_interval={probe_s}",
                    "-c tcp_keepalives_count=3",
                    f"-c tcp_user_timeout={timeout_ms}",
                )
            )
        return create_engine(
            url,
            pool_pre_ping=pre_ping,
            pool_size=10,
            max_overflow=40,
            hide_parameters=True,
            connect_args=connect_args,
        )
    engine = create_engine(
        url, connect_args={"check_same_thread": False, "timeout": 60}, hide_parameters=True
    )

    @event.listens_for(engine, "connect")
    def _sqlite_connect(dbapi_conn: sqlite3.Connection, _record: object) -> None:
        # Take control of transactions so every one starts with BEGIN IMMEDIATE: threads then
        # queue for the write lock instead of failing on a read-to-write upgrade.
        dbapi_conn.isolation_level = None
        dbapi_conn.execute("PRAGMA journal_mode=WAL")
        dbapi_conn.execute("PRAGMA synchronous=NORMAL")
        dbapi_conn.execute("PRAGMA foreign_keys=ON")

    @event.listens_for(engine, "begin")
    def _sqlite_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


class Database:
    """One engine and its session factory, built once per process by its runtime."""

    def __init__(
        self, url: str, pre_ping: bool = True, idle_transaction_timeout: float = 0
    ) -> None:
        self.url = url
        self.engine = make_engine(url, pre_ping, idle_transaction_timeout)
        self.dialect = self.engine.dialect.name
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One ORM transaction: commit on success, roll back on error."""
        session = self._sessions()
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One Core transaction (no ORM)."""
        with self.engine.begin() as conn:
            yield conn

    @contextmanager
    def single_statement(self) -> Iterator[Connection]:
        """For one statement, atomic on its own: on Postgres it runs in autocommit, one round
        trip instead of three (BEGIN, the statement, COMMIT). SQLite keeps its write-locking
        transaction (see make_engine)."""
        if self.dialect != "postgresql":
            with self.engine.begin() as conn:
                yield conn
            return
        with self.engine.connect() as conn:
            yield conn.execution_options(isolation_level="AUTOCOMMIT")

    def ping(self) -> None:
        """One round trip (a new connection when the pool has none). Raises
        DatabaseUnavailable, saying why on one line, when the database does not exist or
        cannot be reached."""
        try:
            with self.engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
        except (OperationalError, InterfaceError) as exc:
            raise DatabaseUnavailable(_reason(exc)) from None

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()
