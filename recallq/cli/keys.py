"""`recallq keys create|list|revoke`: API keys, on the database directly
(RECALLQ_DATABASE_URL), as `recallq migrate` does: whoever can run them can read the
database anyway, and the API has no route that makes keys. A new key is printed once, on
stdout, and never again."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime

from recallq.state.apikeys import InvalidKeyRequest, KeyStore
from recallq.state.db import Database
from recallq.state.tables import as_utc


def _key_store(args: argparse.Namespace) -> KeyStore:
    return KeyStore(Database(args.settings.database_url))


def create(args: argparse.Namespace) -> int:
    try:
        info, key = _key_store(args).create(args.project, args.role, args.label)
    except InvalidKeyRequest as exc:
        print(f"recallq: {exc}", file=sys.stderr)
        return 2
    print(key)
    print(
        f"key {info.id} ({info.role}) for project {info.project}: shown once, store it now "
        "(recallq keeps only its hash)",
        file=sys.stderr,
    )
    return 0


KEY_LIST_HEADER = ("id", "project", "role", "prefix", "state", "last used (UTC)", "label")


def _minute(moment: datetime | None) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M") if moment else "never"


def list_keys(args: argparse.Namespace) -> int:
    found = _key_store(args).list(args.project)
    if args.json:
        for info in found:
            fields = {
                "id": info.id,
                "project": info.project,
                "role": info.role,
                "prefix": info.prefix,
                "label": info.label,
                "created_at": info.created_at.isoformat(),
                "last_used_at": info.last_used_at.isoformat() if info.last_used_at else None,
                "revoked_at": info.revoked_at.isoformat() if info.revoked_at else None,
            }
            print(json.dumps(fields))
        return 0
    if not found:
        print("no keys" + (f" in project {args.project}" if args.project else ""))
        return 0
    rows = [
        (
            info.id,
            info.project,
            info.role,
            f"{info.prefix}…",
            "revoked" if info.revoked_at else "active",
            # written at most once a minute (recallq.state.apikeys.LAST_USED_RESOLUTION)
            _minute(as_utc(info.last_used_at) if info.last_used_at else None),
            info.label or "",
        )
        for info in found
    ]
    widths = [max(len(row[i]) for row in (KEY_LIST_HEADER, *rows)) for i in range(6)]
    for line in (KEY_LIST_HEADER, *rows):
        cells = [cell.ljust(width) for cell, width in zip(line[:-1], widths, strict=True)]
        print("  ".join([*cells, line[-1]]).rstrip())
    return 0


def revoke(args: argparse.Namespace) -> int:
    revoked = _key_store(args).revoke(args.key_id)
    if not revoked:
        print(f"recallq: no active key {args.key_id}", file=sys.stderr)
        return 2  # a rejected request, as every other
    print(f"recallq: key {args.key_id} revoked", file=sys.stderr)
    return 0
