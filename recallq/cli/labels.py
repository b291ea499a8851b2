"""`recallq label`, `recallq agreement` and `recallq gate --corrected`: human labels of claims.

    recallq label RUN --sample N [--seed S] --out to_label.csv   draw N items, write their claims
    recallq label RUN --import labelled.csv                      store the filled-in file
    recallq agreement RUN [--by FIELD] [--against RUN] [--json]  judge vs person (or judge)
    recallq gate RUN --min-score X --corrected                   gate on the corrected lower bound
    recallq rejudge RUN [--model M]                              the same claims, judged again

Like the other client commands they ask the API when one is configured (`--api URL` or
RECALLQ_API_URL) and otherwise the local database; both ends run recallq.labels.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from recallq.cli.backends import open_local_database
from recallq.client import Client
from recallq.display import database_label
from recallq.gates import CommandError, Exit
from recallq.status import PublicItemStatus

if TYPE_CHECKING:
    from recallq.db import Database

PROJECT = "default"  # the local database's one project


def add_commands(sub: Any) -> None:
    """Add `label` and `agreement` to the `recallq` subcommands, and `--corrected` to `gate`
    (which must be there already)."""
    label = sub.add_parser("label", help="sample claims to label by hand, or import labels")
    label.add_argument("run_id")
    action = label.add_mutually_exclusive_group(required=True)
    action.add_argument("--sample", type=_size, metavar="N", help="draw N items at random")
    action.add_argument("--import", dest="import_file", type=Path, metavar="FILE",
                        help="a labels file (CSV or JSONL) to store")  # fmt: skip
    label.add_argument("--seed", type=_seed, default=0, help="of the sample (default 0)")
    label.add_argument("--out", type=Path, help="the CSV to fill in (with --sample)")
    _add_api(label)
    label.set_defaults(func=cmd_label)

    agreement = sub.add_parser("agreement", help="how far the judge agrees with the labels")
    agreement.add_argument("run_id")
    agreement.add_argument("--by", metavar="FIELD", help="also per value of this metadata field")
    agreement.add_argument(
        "--against", metavar="RUN", help="another run of the same claims: judge vs judge"
    )
    agreement.add_argument("--json", action="store_true", help="the agreement as JSON")
    _add_api(agreement)
    agreement.set_defaults(func=cmd_agreement)

    rejudge = sub.add_parser(
        "rejudge", help="attribute a local run's claims again (another model, or the same)"
    )
    rejudge.add_argument("run_id")
    rejudge.add_argument("--model", help="the judge of the new run (default: the run's own)")
    rejudge.add_argument("--concurrency", type=int, help="judge calls in flight (threads)")
    rejudge.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_api(rejudge)
    rejudge.set_defaults(func=cmd_rejudge)

    gate = sub.choices["gate"]
    gate.add_argument(
        "--corrected",
        action="store_true",
        help="gate on the lower bound of the mean corrected by human labels of a random sample",
    )
    gate.set_defaults(func=_corrected_gate(gate.get_default("func")))


def _add_api(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--api",
        metavar="URL",
        help="the API to ask (default RECALLQ_API_URL; without either, the local database)",
    )


def _seed(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise argparse.ArgumentTypeError(f"must be a whole number, 0 or more: {text!r}")
    return int(text)


def _size(text: str) -> int:
    from recallq.labels import MAX_SAMPLE

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= MAX_SAMPLE:
        raise argparse.ArgumentTypeError(f"must be 1 to {MAX_SAMPLE}")
    return value


class LabelBackend(Protocol):
    def draw(self, run_id: str, size: int, seed: int) -> tuple[list[str], str]:
        """Draw a sample: its item ids and the CSV of its claims."""
        ...

    def import_file(self, run_id: str, data: bytes) -> dict[str, Any]: ...

    def agreement(self, run_id: str, by: str | None, against: str | None) -> dict[str, Any]: ...

    def close(self) -> None: ...


class ApiLabels:
    def __init__(self, client: Client) -> None:
        self.client = client

    def draw(self, run_id: str, size: int, seed: int) -> tuple[list[str], str]:
        path = f"/v1/runs/{run_id}/labels/sample"
        drawn = self.client.send("POST", path, json={"size": size, "seed": seed}).json()
        sheet = self.client.send("GET", path, params={"format": "csv"}).text
        return list(drawn["item_ids"]), sheet

    def import_file(self, run_id: str, data: bytes) -> dict[str, Any]:
        kind = "application/x-ndjson" if data.lstrip().startswith(b"{") else "text/csv"
        response = self.client.send(
            "POST", f"/v1/runs/{run_id}/labels", content=data, headers={"Content-Type": kind}
        )
        result: dict[str, Any] = response.json()
        return result

    def agreement(self, run_id: str, by: str | None, against: str | None) -> dict[str, Any]:
        return self.client.get(f"/v1/runs/{run_id}/agreement", {"by": by, "against": against})

    def close(self) -> None:
        self.client.close()


class LocalLabels:
    def __init__(self, database: Database, where: str) -> None:
        self.database, self.where = database, where

    def _run(self, session: Any, run_id: str) -> Any:
        from recallq.tables import Run

        run = session.get(Run, run_id)
        if run is None or run.project != PROJECT:
            raise CommandError(
                f"run {run_id} not found in the local database {self.where} (a run of a "
                "service: pass --api URL or set RECALLQ_API_URL)"
            )
        return run

    def _labels(self, work: Callable[[Any], Any]) -> Any:
        from recallq import labels

        with self.database.session() as session:
            try:
                return work(session)
            except labels.LabelError as exc:
                raise CommandError(exc.message) from None

    def draw(self, run_id: str, size: int, seed: int) -> tuple[list[str], str]:
        from recallq import labels

        def work(session: Any) -> tuple[list[str], str]:
            run = self._run(session, run_id)
            keys = labels.draw_sample(session, run, size, seed, None)
            return keys, "".join(labels.sample_lines(labels.sample_rows(session, run, keys)))

        result: tuple[list[str], str] = self._labels(work)
        return result

    def import_file(self, run_id: str, data: bytes) -> dict[str, Any]:
        from recallq import labels

        def work(session: Any) -> dict[str, Any]:
            run = self._run(session, run_id)
            rows, unreadable = labels.parse_file(data)
            result = labels.import_rows(session, run.id, rows, None)
            result["problems"] = sorted(
                [*unreadable, *result["problems"]], key=lambda p: int(p["line"])
            )
            return result

        result: dict[str, Any] = self._labels(work)
        return result

    def agreement(self, run_id: str, by: str | None, against: str | None) -> dict[str, Any]:
        from recallq import labels

        def work(session: Any) -> dict[str, Any]:
            run = self._run(session, run_id)
            if against is None:
                return labels.agreement_view(session, run, by)
            return labels.against_view(session, run, self._run(session, against))

        result: dict[str, Any] = self._labels(work)
        return result

    def close(self) -> None:
        self.database.dispose()


def open_labels(args: argparse.Namespace) -> LabelBackend:
    settings = args.settings
    url = getattr(args, "api", None) or settings.api_url
    if url:
        return ApiLabels(Client(url, settings.api_key))
    return LocalLabels(open_local_database(settings), database_label(settings.database_url))


def cmd_label(args: argparse.Namespace) -> int:
    if args.sample is not None and args.out is None:
        raise CommandError("--sample writes a file to fill in: pass --out FILE.csv")
    if args.import_file is not None and args.out is not None:
        raise CommandError("--out goes with --sample, not with --import")
    data = None
    if args.import_file is not None:
        try:
            data = args.import_file.read_bytes()
        except OSError as exc:
            raise CommandError(f"cannot read {args.import_file}: {exc.strerror}") from None
    out, existed = None, args.out is not None and args.out.exists()
    if args.sample is not None:
        # opened (not truncated) before the draw: a path that cannot be written must not
        # replace the kept sample
        try:
            out = args.out.open("a", encoding="utf-8", newline="")
        except OSError as exc:
            raise CommandError(f"cannot write {args.out}: {exc.strerror}") from None
    backend = open_labels(args)
    try:
        if data is not None:
            result = backend.import_file(args.run_id, data)
            for problem in result["problems"]:
                print(
                    f"recallq: {args.import_file}:{problem['line']}: {problem['problem']}",
                    file=sys.stderr,
                )
            print(
                f"{result['stored']} labels stored, {result['skipped']} rows left empty, "
                f"{len(result['problems'])} rows with problems"
            )
            return Exit.FAILED if result["problems"] else Exit.OK
        assert out is not None
        try:
            keys, sheet = backend.draw(args.run_id, args.sample, args.seed)
        except BaseException:
            out.close()
            if not existed:
                args.out.unlink(missing_ok=True)
            raise
        with out:
            out.seek(0)
            out.truncate()
            out.write(sheet)
    finally:
        backend.close()
    claims = max(0, sum(1 for _ in csv.reader(io.StringIO(sheet))) - 1)
    print(
        f"{len(keys)} items ({claims} claims) drawn with seed {args.seed} into {args.out}: fill "
        f"in human_verdict (yes/no), then `recallq label {args.run_id} --import {args.out}`"
    )
    return Exit.OK


def cmd_agreement(args: argparse.Namespace) -> int:
    backend = open_labels(args)
    try:
        body = backend.agreement(args.run_id, args.by, args.against)
    finally:
        backend.close()
    if args.json:
        import json

        print(json.dumps(body, indent=2, ensure_ascii=False))
        return Exit.OK
    print(describe(body))
    for name, group in (body.get("by_group") or {}).items():
        print(f"\n{args.by} = {name}")
        print(describe(group))
    return Exit.OK


def _interval(values: list[float] | None) -> str:
    return "" if not values else f" [{values[0]:.4g}, {values[1]:.4g}]"


def _value(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def describe(body: dict[str, Any]) -> str:
    """The agreement as a few lines for people."""
    if not body["labelled_claims"]:
        return "no labelled claims (recallq label RUN --sample N --out FILE.csv to start)"
    c = body["confusion"]
    other = "other judge" if "against" in body else "person"
    lines = [
        f"{body['labelled_claims']} claims of {body['labelled_items']} items compared",
        f"agreement {_value(body['agreement'])}, kappa {_value(body['kappa'])}"
        f"{_interval(body['kappa_ci95'])}",
        f"judge precision {_value(body['precision'])}, recall {_value(body['recall'])} "
        "on supported claims",
        f"{'':14}{other} yes  {other} no",
        f"{'judge yes':14}{c['judge_yes_human_yes']:>{len(other) + 4}}  "
        f"{c['judge_yes_human_no']:>{len(other) + 3}}",
        f"{'judge no':14}{c['judge_no_human_yes']:>{len(other) + 4}}  "
        f"{c['judge_no_human_no']:>{len(other) + 3}}",
    ]
    if "against" in body:
        lines.append(
            f"verdicts flipped: {_value(body['flip_rate'])}{_interval(body['flip_rate_ci95'])}"
        )
        return "\n".join(lines)
    corrected = body.get("corrected")
    if corrected:
        lines += [
            f"mean score: judge {_value(corrected['judge_mean_score'])}, corrected "
            f"{_value(corrected['mean_score'])}{_interval(corrected['mean_score_ci95'])} "
            f"with {corrected['labelled_items']} labelled items",
            f"claim recall: judge {_value(corrected['judge_claim_recall'])}, corrected "
            f"{_value(corrected['claim_recall'])}{_interval(corrected['claim_recall_ci95'])}",
        ]
    else:
        lines.append(
            "no corrected mean: the labels are not on a random sample "
            "(recallq label RUN --sample N draws one)"
        )
    return "\n".join(lines)


def _corrected_gate(plain: Callable[[argparse.Namespace], int]) -> Callable[..., int]:
    def gate(args: argparse.Namespace) -> int:
        if not getattr(args, "corrected", False):
            return plain(args)
        return corrected_gate(args)

    gate.__name__ = "cmd_gate"
    return gate


def corrected_gate(args: argparse.Namespace) -> int:
    """`recallq gate RUN --min-score X --corrected`: the run's own gates, with the mean score
    replaced by the lower bound of its corrected 95% interval."""
    from recallq import gates
    from recallq.cli.backends import open_backend

    if args.min_score is None:
        raise CommandError("--corrected gates the corrected mean: pass --min-score X")
    backend = open_backend(args)
    try:
        view = backend.view(args.run_id)
    finally:
        backend.close()
    labels = open_labels(args)
    try:
        body = labels.agreement(args.run_id, None, None)
    finally:
        labels.close()
    corrected = body.get("corrected")
    if not corrected:
        raise CommandError(
            f"run {args.run_id} has no corrected mean: label a random sample first "
            f"(`recallq label {args.run_id} --sample N --out FILE.csv`, then --import)"
        )
    reasons = gates.misses(view, gates.Gate(None, args.max_failed))
    low = corrected["mean_score_ci95"][0]
    bound = (
        f"corrected mean score {gates.number(corrected['mean_score'])} "
        f"(95% lower bound {gates.number(low)}, {corrected['labelled_items']} labelled items)"
    )
    if low < args.min_score:
        reasons.append(f"{bound} is below --min-score {gates.number(args.min_score)}")
    for reason in reasons:
        print(f"recallq: gate failed: {reason}", file=sys.stderr)
    if reasons:
        return Exit.FAILED
    print(f"gate passed: {bound} >= --min-score {gates.number(args.min_score)}")
    return Exit.OK


def cmd_rejudge(args: argparse.Namespace) -> int:
    """`recallq rejudge RUN [--model M]` (local runs): a new run of the same items whose judge
    attributes the run's own claims, not claims it extracts again. The claims are handed over
    through the claim cache: each scored item's claims are stored for (its ground truth, M),
    so the new run finds them there and makes attribution calls only. An entry M already had
    for a ground truth is kept (the cache is first-write-wins) and reported."""
    import json
    import tempfile

    from recallq import queries
    from recallq.claim_cache import ClaimCache
    from recallq.cli import local_runs

    settings = args.settings
    if getattr(args, "api", None) or settings.api_url:
        raise CommandError(
            "rejudge works on local runs; a service run's claims_from is not built yet"
        )
    backend = open_labels(args)
    assert isinstance(backend, LocalLabels)
    try:
        with backend.database.session() as session:
            run = backend._run(session, args.run_id)
            model = args.model or run.model
            items = list(queries.iter_results(session, run.id, item_data=True))
        kept = 0
        with backend.database.transaction() as conn:
            for item in items:
                claims = [c["text"] for c in item["claims"]]
                if (
                    item["status"] != PublicItemStatus.SUCCEEDED
                    or not claims
                    or not item["ground_truth"]
                ):
                    continue
                key = ClaimCache.key(item["ground_truth"], model, project=PROJECT)
                held = ClaimCache.read(conn, [key]).get(key)
                if held is None:
                    ClaimCache.write(conn, key, claims)
                elif held != claims:
                    kept += 1
    finally:
        backend.close()
    if kept:
        print(
            f"recallq: {kept} items keep the claims {model} extracted before; "
            "`recallq agreement --against` compares the claims the runs share",
            file=sys.stderr,
        )
    folder = Path(tempfile.mkdtemp(prefix="recallq-rejudge-"))
    source = folder / f"rejudge-{args.run_id}.jsonl"
    with source.open("w", encoding="utf-8") as out:
        for item in items:
            record = {
                **(item["metadata"] or {}),
                "id": item["id"],
                "input": item["input"],
                "output": item["output"],
                "ground_truth": item["ground_truth"],
                "context": item["context"],
            }
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    run_args = argparse.Namespace(
        file=source,
        model=model,
        name=f"rejudge of {args.run_id} by {model}",
        context=None,
        context_extractor=None,
        map=None,
        quiet=args.quiet,
        scale=run.scale,
        out=None,
        format=None,
        concurrency=args.concurrency,
        fresh=True,
        by=None,
        report=None,
        batch=False,
        min_score=None,
        max_failed=None,
        argv=["rejudge", *getattr(args, "argv", [])[1:]],
        settings=settings,
    )
    try:
        return local_runs.run(run_args)
    finally:
        source.unlink(missing_ok=True)
        folder.rmdir()
