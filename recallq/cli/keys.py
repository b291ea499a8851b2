"""`recallq keys create|list|revoke`: API keys, on the database directly
(RECALLQ_DATABASE_URL), as `recallq migrate` does: whoever can run them can read the
database anyway, and the API has no route that makes keys. A new key is printed once, on
stdout, and never again."""

from __future__ import annotations

import argparse
import json
import sys

from recallq.apikeys import InvalidKeyRequest, KeyStore
from recallq.db import Database


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


def list_keys(args: argparse.Namespace) -> int:
    found = _key_store(args).list(args.project)
    for info in found:
        row = {
            "id": info.id,
            "project": info.project,
            "role": info.role,
            "prefix": info.prefix,
            "label": info.label,
            "created_at": info.created_at.isoformat(),
            "last_used_at": info.last_used_at.isoformat() if info.last_used_at else None,
            "revoked_at": info.revoked_at.isoformat() if info.revoked_at else None,
        }
        if args.json:
            print(json.dumps(row))
        else:
            state = "revoked" if info.revoked_at else "active"
            print(
                f"{info.id}  {info.project:<20} {info.role:<5}  {info.prefix}…  {state:<7}  "
                f"{info.label or ''}"
            )
    return 0


def revoke(args: argparse.Namespace) -> int:
    revoked = _key_store(args).revoke(args.key_id)
    if not revoked:
        print(f"recallq: no active key {args.key_id}", file=sys.stderr)
        return 1
    print(f"recallq: key {args.key_id} revoked", file=sys.stderr)
    return 0
