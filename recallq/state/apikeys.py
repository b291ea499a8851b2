"""API keys: which project a request acts in, and what it may do there.

A key is `rq_` followed by 32 random bytes (URL-safe base64). Only its SHA-256 is stored: the
key carries 256 bits of entropy, so a slow password hash would add nothing, and a copy of the
table gives nobody a usable key. A key is shown once, when it is made (`recallq keys create`).

Roles, each allowing what the one before it does:
    read    GET every run of the project, its items and results
    write   also submit runs (and dry runs), cancel and retry them
    admin   also delete runs

Keys are managed on the database directly (`recallq keys ...`, like `recallq migrate`): whoever
may do that can read the database anyway, and the API has no route that makes keys.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, update

from recallq.state.db import Database
from recallq.state.tables import ApiKey, as_utc, utcnow

KEY_PREFIX = "rq_"
ROLES = ("read", "write", "admin")
#: the project of every request when RECALLQ_AUTH=off
DEFAULT_PROJECT = "default"
PROJECT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# how many characters of a key `keys list` shows (prefix included): enough to tell keys apart,
# far too few to guess the rest (the other 40 characters carry 240 bits)
SHOWN_CHARACTERS = 11
# a key's last use is written at most this often, so requests do not each write a row
LAST_USED_RESOLUTION = timedelta(minutes=1)
# a bearer token longer than this is no key of ours: not even hashed
MAX_TOKEN_LENGTH = 200


class InvalidKeyRequest(ValueError):
    """A bad argument to a key command (unknown role, bad project name)."""


@dataclass(frozen=True)
class Principal:
    """Who a request is: its key's id (None when auth is off), project and role."""

    key_id: str | None
    project: str
    role: str

    def may(self, role: str) -> bool:
        """Whether this principal's role includes `role`."""
        return ROLES.index(self.role) >= ROLES.index(role)


@dataclass(frozen=True)
class KeyInfo:
    """A key as `keys list` shows it: never the key itself."""

    id: str
    project: str
    role: str
    label: str | None
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None


def new_key() -> str:
    return KEY_PREFIX + base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def looks_like_key(token: str) -> bool:
    """Cheap shape check before any database work: our prefix, a bounded length, ASCII."""
    return token.startswith(KEY_PREFIX) and len(token) <= MAX_TOKEN_LENGTH and token.isascii()


def check_role(role: str) -> str:
    if role not in ROLES:
        raise InvalidKeyRequest(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    return role


def check_project(project: str) -> str:
    if not PROJECT_NAME.fullmatch(project):
        raise InvalidKeyRequest(
            "project must be 1 to 64 letters, digits, '_', '.' or '-', starting with a letter "
            "or a digit"
        )
    return project


def _info(row: ApiKey) -> KeyInfo:
    return KeyInfo(
        row.id,
        row.project,
        row.role,
        row.label,
        row.prefix,
        row.created_at,
        row.revoked_at,
        row.last_used_at,
    )


class KeyStore:
    """The api_keys table."""

    def __init__(self, database: Database) -> None:
        self._db = database

    def create(self, project: str, role: str, label: str | None = None) -> tuple[KeyInfo, str]:
        """A new key; returns it with its record. The key itself is not kept anywhere."""
        check_project(project)
        check_role(role)
        if label is not None and len(label) > 200:
            raise InvalidKeyRequest("label must be at most 200 characters")
        key = new_key()
        row = ApiKey(
            id=secrets.token_hex(8),
            project=project,
            role=role,
            label=label,
            key_hash=hash_key(key),
            prefix=key[:SHOWN_CHARACTERS],
            created_at=utcnow(),
        )
        with self._db.session() as session:
            session.add(row)
            session.flush()
            info = _info(row)
        return info, key

    def list(self, project: str | None = None) -> list[KeyInfo]:
        query = select(ApiKey).order_by(ApiKey.project, ApiKey.created_at)
        if project is not None:
            query = query.where(ApiKey.project == project)
        with self._db.session() as session:
            return [_info(row) for row in session.scalars(query)]

    def revoke(self, key_id: str) -> bool:
        """Revoke a key from now on; False when no such key is active."""
        with self._db.session() as session:
            result = session.execute(
                update(ApiKey)
                .where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None))
                .values(revoked_at=utcnow())
            )
            return bool(getattr(result, "rowcount", 0))

    def authenticate(self, token: str) -> Principal | None:
        """The principal of an active key, or None. One indexed read; the key's last use is
        written at most once a minute."""
        if not looks_like_key(token):
            return None
        digest = hash_key(token)
        with self._db.session() as session:
            row = session.execute(
                select(ApiKey.id, ApiKey.project, ApiKey.role, ApiKey.last_used_at).where(
                    ApiKey.key_hash == digest, ApiKey.revoked_at.is_(None)
                )
            ).one_or_none()
            if row is None:
                return None
            now = utcnow()
            if row.last_used_at is None or as_utc(row.last_used_at) < now - LAST_USED_RESOLUTION:
                session.execute(update(ApiKey).where(ApiKey.id == row.id).values(last_used_at=now))
        return Principal(row.id, row.project, row.role)

    def active(self, key_id: str) -> tuple[Principal, str] | None:
        """The principal of an active key by its id, with the key's stored hash (a signed-in
        browser session names its key by id, and is valid only while the key is)."""
        if len(key_id) > 64 or not key_id.isascii():
            return None
        with self._db.session() as session:
            row = session.execute(
                select(ApiKey.project, ApiKey.role, ApiKey.key_hash).where(
                    ApiKey.id == key_id, ApiKey.revoked_at.is_(None)
                )
            ).one_or_none()
        if row is None:
            return None
        return Principal(key_id, row.project, row.role), row.key_hash
