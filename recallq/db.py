"""Engine and session factory; SQLite tuned so an in-process worker can share it."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from recallq.settings import get_settings

_lock = threading.Lock()
_sessionmakers: dict[str, sessionmaker[Session]] = {}
_pre_ping = True


def skip_pre_ping() -> None:
    """For workers: no liveness ping (a round trip) before each transaction. A connection
    that died with a database restart fails its statement instead, SQLAlchemy then discards
    the whole pool, and the worker hands the message back (see worker.tasks)."""
    global _pre_ping
    _pre_ping = False


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def make_engine(url: str) -> Engine:
    if not is_sqlite(url):
        return create_engine(url, pool_pre_ping=_pre_ping, pool_size=10, max_overflow=40)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 60})

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


def _sessionmaker(url: str | None) -> sessionmaker[Session]:
    url = url or get_settings().database_url
    with _lock:
        if url not in _sessionmakers:
            _sessionmakers[url] = sessionmaker(make_engine(url), expire_on_commit=False)
        return _sessionmakers[url]


def get_engine(url: str | None = None) -> Engine:
    engine = _sessionmaker(url).kw["bind"]
    assert isinstance(engine, Engine)
    return engine


@contextmanager
def session_scope(url: str | None = None) -> Iterator[Session]:
    """One transaction: commit on success, roll back on error."""
    session = _sessionmaker(url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


@contextmanager
def transaction(url: str | None = None) -> Iterator[Connection]:
    """One Core transaction (no ORM): for the workers' hot path."""
    with get_engine(url).begin() as conn:
        yield conn


@contextmanager
def single_statement(url: str | None = None) -> Iterator[Connection]:
    """For one statement, atomic on its own: on Postgres it runs in autocommit, one round trip
    instead of three (BEGIN, the statement, COMMIT). SQLite keeps its write-locking
    transaction (see make_engine)."""
    engine = get_engine(url)
    if engine.dialect.name != "postgresql":
        with engine.begin() as conn:
            yield conn
        return
    with engine.connect() as conn:
        yield conn.execution_options(isolation_level="AUTOCOMMIT")


def dispose_engines() -> None:
    """Close every pooled connection (after fork, and when tests switch databases)."""
    with _lock:
        for maker in _sessionmakers.values():
            maker.kw["bind"].dispose()
        _sessionmakers.clear()
