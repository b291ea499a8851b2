"""`recallq keys create|list|revoke`, `recallq delete RUN_ID` and `recallq estimate FILE`.

`keys` work on the database directly (RECALLQ_DATABASE_URL), as `recallq migrate` does:
whoever can run them can read the database anyway, and the API has no route that makes keys.
A new key is printed once, on stdout, and never again.

`delete` asks the API (RECALLQ_API_URL, with the admin key in RECALLQ_API_KEY).
`estimate` reads the file and the models file here: nothing is sent anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any


def add_commands(sub: Any) -> None:
    """Add this module's commands to the `recallq` parser's subcommands."""
    keys = sub.add_parser("keys", help="make, list and revoke API keys (on the database)")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="make a key; it is printed once")
    create.add_argument("--project", required=True, help="the project the key acts in")
    create.add_argument("--role", required=True, choices=["admin", "write", "read"])
    create.add_argument("--label", help="what the key is for (shown by `keys list`)")
    create.set_defaults(func=cmd_keys_create)
    listing = keys_sub.add_parser("list", help="list keys (never the keys themselves)")
    listing.add_argument("--project", help="only this project's keys")
    listing.add_argument("--json", action="store_true", help="as JSON lines")
    listing.set_defaults(func=cmd_keys_list)
    revoke = keys_sub.add_parser("revoke", help="revoke a key from now on")
    revoke.add_argument("key_id")
    revoke.set_defaults(func=cmd_keys_revoke)

    delete = sub.add_parser("delete", help="delete an ended run with its items (admin key)")
    delete.add_argument("run_id")
    delete.add_argument(
        "--api",
        default=os.environ.get("RECALLQ_API_URL", "http://127.0.0.1:8000"),
        help="API base URL (env RECALLQ_API_URL)",
    )
    delete.set_defaults(func=cmd_delete)

    estimate = sub.add_parser(
        "estimate", help="items, judge calls, tokens and cost of a run, without running it"
    )
    estimate.add_argument("file", type=Path)
    estimate.add_argument("--model", help="judge model (default: RECALLQ_DEFAULT_MODEL)")
    estimate.add_argument("--context", type=_json_argument, help="static context, a JSON list")
    estimate.add_argument("--context-extractor", type=_json_argument, help="JSON extractor spec")
    estimate.add_argument("--json", action="store_true", help="print the estimate as JSON")
    estimate.set_defaults(func=cmd_estimate)


def _json_argument(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc.msg} at column {exc.colno}") from exc


def _key_store() -> Any:
    from recallq.apikeys import KeyStore
    from recallq.db import Database
    from recallq.settings import Settings

    return KeyStore(Database(Settings().database_url))


def cmd_keys_create(args: argparse.Namespace) -> int:
    from recallq.apikeys import InvalidKeyRequest

    try:
        info, key = _key_store().create(args.project, args.role, args.label)
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


def cmd_keys_list(args: argparse.Namespace) -> int:
    found = _key_store().list(args.project)
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


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    revoked = _key_store().revoke(args.key_id)
    if not revoked:
        print(f"recallq: no active key {args.key_id}", file=sys.stderr)
        return 1
    print(f"recallq: key {args.key_id} revoked", file=sys.stderr)
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    import httpx

    headers = {}
    key = os.environ.get("RECALLQ_API_KEY")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    url = f"{args.api.rstrip('/')}/v1/runs/{args.run_id}"
    try:
        response = httpx.delete(url, headers=headers, timeout=300)
    except httpx.HTTPError as exc:
        print(
            f"recallq: cannot reach the API at {args.api} ({type(exc).__name__})", file=sys.stderr
        )
        return 2
    if response.status_code == 204:
        print(f"recallq: run {args.run_id} deleted", file=sys.stderr)
        return 0
    try:
        error = response.json()["error"]
        detail = f"{response.status_code} {error['code']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        detail = f"{response.status_code}"
    print(f"recallq: {detail}", file=sys.stderr)
    return 1


def cmd_estimate(args: argparse.Namespace) -> int:
    from recallq import dataset, ingest
    from recallq.db import Database, is_sqlite
    from recallq.judge_models import JudgeModelsError, load_models
    from recallq.settings import Settings

    settings = Settings()
    if not args.file.exists():
        print(f"recallq: no such file: {args.file}", file=sys.stderr)
        return 2
    try:
        models = load_models(settings.models_file)
        spec = ingest.build_spec(
            model=args.model,
            default_model=settings.default_model,
            known_models=models,
            context=args.context,
            context_extractor=args.context_extractor,
            limits=ingest.limits_of(settings),
        )
    except (ingest.SubmissionError, JudgeModelsError) as exc:
        print(f"recallq: {exc}", file=sys.stderr)
        return 2
    # the claim cache of the local database, when there is one (an estimate makes none)
    url = settings.database_url
    database_file = Path(url.removeprefix("sqlite:///")) if is_sqlite(url) else None
    use_database = database_file is None or database_file.exists()
    try:
        items = dataset.items_from(args.file)
        if use_database:
            database = Database(url)
            try:
                with database.session() as session:
                    result = ingest.estimate_run(session, spec, items, settings, models)
            finally:
                database.dispose()
        else:
            result = _estimate_without_database(spec, items, settings, models)
    except ingest.SubmissionError as exc:
        print(f"recallq: {args.file}: {exc.message}", file=sys.stderr)
        return 2
    except dataset.DatasetError as exc:
        print(f"recallq: {exc}", file=sys.stderr)
        return 2
    _print_estimate(result.as_dict(), args.json)
    return 0


def _estimate_without_database(spec: Any, items: Any, settings: Any, models: Any) -> Any:
    """An estimate with no claim cache to look in (no local database yet)."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from recallq import ingest
    from recallq.tables import Base

    engine = create_engine("sqlite://")
    Base.metadata.create_all(engine)
    try:
        with Session(engine) as session:
            return ingest.estimate_run(session, spec, items, settings, models)
    finally:
        engine.dispose()


def _print_estimate(estimate: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(estimate))
        return
    cost = estimate["cost_usd"]
    rows = [
        ("model", estimate["model"]),
        ("items", str(estimate["items"])),
        ("judge calls", f"{estimate['calls']} ({estimate['cache_hits']} claim-cache hits)"),
        ("prompt tokens", str(estimate["prompt_tokens"])),
        ("completion tokens", str(estimate["completion_tokens"])),
        ("cost", "unknown (no price for this model)" if cost is None else f"${cost:.4f}"),
    ]
    width = max(len(name) for name, _ in rows)
    print("recallq estimate (nothing was run)")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
