"""`recallq label`, `recallq agreement` and `recallq gate --corrected`: human labels of claims.

    recallq label RUN --sample N [--seed S] --out to_label.csv   draw N items, write their claims
    recallq label RUN --import labelled.csv                      store the filled-in file
    recallq agreement RUN [--by FIELD] [--against RUN] [--json]  judge vs person (or judge)
    recallq gate RUN --min-score X --corrected                   gate on the corrected lower bound
    recallq rejudge RUN [--model M]                              the same claims, judged again

Like the other client commands they ask the API when one is configured (`--api URL` or
RECALLQ_API_URL) and otherwise the local database; both ends run recallq.labels.service.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from recallq.cli import local_runs
from recallq.cli.backends import api_url, open_backend, open_local_database, wait_for_service_run
from recallq.cli.output import print_json, print_run
from recallq.client import Client
from recallq.core import gates
from recallq.core.exits import CommandError, Exit
from recallq.labels import files
from recallq.labels.service import LabelService
from recallq.labels.store import LabelError
from recallq.state.runs import RunNotFound
from recallq.viewer.text import count, database_label

if TYPE_CHECKING:
    from recallq.state.db import Database

PROJECT = "default"  # the local database's one project


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
        kind = {"jsonl": "application/x-ndjson", "csv": "text/csv"}[files.file_format(data)]
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
    """The local database, through the same label service as the API."""

    def __init__(self, database: Database, where: str) -> None:
        self.database, self.where = database, where
        self.labels = LabelService(database)

    @contextmanager
    def _answering(self) -> Iterator[None]:
        try:
            yield
        except RunNotFound as exc:
            raise CommandError(
                f"run {exc.run_id} not found in the local database {self.where} (a run of a "
                "service: pass --api URL or set RECALLQ_API_URL)"
            ) from None
        except LabelError as exc:
            raise CommandError(exc.message) from None

    def draw(self, run_id: str, size: int, seed: int) -> tuple[list[str], str]:
        with self._answering():
            keys = self.labels.draw_sample(run_id, PROJECT, size, seed, None)
            rows = self.labels.sample_rows(run_id, keys)
        return keys, "".join(self.labels.sample_lines(rows))

    def import_file(self, run_id: str, data: bytes) -> dict[str, Any]:
        with self._answering():
            return self.labels.import_file(run_id, PROJECT, data, None, None)

    def agreement(self, run_id: str, by: str | None, against: str | None) -> dict[str, Any]:
        with self._answering():
            return self.labels.agreement(run_id, PROJECT, by, against)

    def close(self) -> None:
        self.database.dispose()


@contextmanager
def open_labels(args: argparse.Namespace) -> Iterator[LabelBackend]:
    """The API's labels or the local database's, closed when the command is done with them."""
    settings = args.settings
    url = api_url(args, settings)
    store: LabelBackend = (
        ApiLabels(Client(url, settings.api_key))
        if url
        else LocalLabels(open_local_database(settings), database_label(settings.database_url))
    )
    try:
        yield store
    finally:
        store.close()


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
    with open_labels(args) as backend:
        if data is not None:
            result = backend.import_file(args.run_id, data)
            for problem in result["problems"]:
                print(
                    f"recallq: {args.import_file}:{problem['line']}: {problem['problem']}",
                    file=sys.stderr,
                )
            total = int(result["problems_total"])
            listed = (
                ""
                if total == len(result["problems"])
                else f" (the first {len(result['problems'])} listed)"
            )
            print(
                f"{count(result['stored'], 'label')} stored, "
                f"{count(result['skipped'], 'row')} left empty, "
                f"{count(total, 'row')} with problems{listed}"
            )
            return Exit.FAILED if total else Exit.OK
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
    claims = max(0, sum(1 for _ in csv.reader(io.StringIO(sheet))) - 1)
    print(
        f"{len(keys)} items ({claims} claims) drawn with seed {args.seed} into {args.out}: fill "
        f"in human_verdict (yes/no), then `recallq label {args.run_id} --import {args.out}`"
    )
    print(
        "(judge_verdict and judge_reason show the judge's answers: hide those columns to label "
        f"without seeing them, or label on the page /runs/{args.run_id}/label, which shows them "
        "after you answer)"
    )
    return Exit.OK


def cmd_agreement(args: argparse.Namespace) -> int:
    with open_labels(args) as backend:
        body = backend.agreement(args.run_id, args.by, args.against)
    if args.json:
        print_json(body)
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
            "`recallq gate --corrected --min-score X` checks the corrected mean score's lower "
            f"bound ({_value(corrected['mean_score_ci95'][0])}), not the claim recall",
        ]
    else:
        lines.append(
            "no corrected mean: the labels are not on a random sample "
            "(recallq label RUN --sample N draws one)"
        )
    return "\n".join(lines)


def cmd_gate(args: argparse.Namespace) -> int:
    """`recallq gate RUN`: with --corrected on the corrected mean (corrected_gate), else on
    the run's own figures (recallq.cli.run_commands.gate)."""
    if args.corrected:
        return corrected_gate(args)
    from recallq.cli import run_commands

    return run_commands.gate(args)


def corrected_gate(args: argparse.Namespace) -> int:
    """`recallq gate RUN --min-score X --corrected`: the run's own gates, with the mean score
    replaced by the lower bound of its corrected 95% interval."""
    if args.min_score is None:
        raise CommandError("--corrected gates the corrected mean: pass --min-score X")
    with open_backend(args) as backend:
        view = backend.view(args.run_id)
    with open_labels(args) as store:
        body = store.agreement(args.run_id, None, None)
    corrected = body.get("corrected")
    if not corrected:
        raise CommandError(
            f"run {args.run_id} has no corrected mean: label a random sample first "
            f"(`recallq label {args.run_id} --sample N --out FILE.csv`, then --import)"
        )
    reasons = gates.misses(view, gates.Gate(None, args.max_failed))
    passed, line = corrected_verdict(corrected, args.min_score)
    if not passed:
        reasons.append(line)
    for reason in reasons:
        print(f"recallq: gate failed: {reason}", file=sys.stderr)
    if reasons:
        return Exit.FAILED
    print(f"gate passed: {line}")
    return Exit.OK


def corrected_verdict(corrected: dict[str, Any], min_score: float) -> tuple[bool, str]:
    """Whether the corrected mean's 95% lower bound reaches `min_score`, and the sentence that
    says so. The figure compared comes first, so the sentence reads true: "the lower bound
    0.40 ... is below 0.45", never "mean 0.6667 ... is below 0.45"."""
    low = corrected["mean_score_ci95"][0]
    bound = (
        f"the 95% lower bound {gates.number(low)} of the corrected mean score "
        f"(corrected mean {gates.number(corrected['mean_score'])}, "
        f"{corrected['labelled_items']} labelled items)"
    )
    if low < min_score:
        return False, (
            f"{bound} is below --min-score {gates.number(min_score)} (--corrected gates on "
            "the lower bound: more labelled items narrow the interval)"
        )
    return True, f"{bound} >= --min-score {gates.number(min_score)}"


def cmd_rejudge(args: argparse.Namespace) -> int:
    """`recallq rejudge RUN [--model M]`: a new run of the same items with `claims_from` RUN,
    so its judge attributes the run's own claims and extracts none (an item the run left
    without claims is extracted as usual). Local runs are scored here; a service run (--api or
    RECALLQ_API_URL) is submitted to the API and waited for; its summary is printed."""
    with open_backend(args) as backend:
        view = backend.view(args.run_id)
        results = b"".join(backend.results(args.run_id, "jsonl", True))
    items = [json.loads(line) for line in results.splitlines() if line.strip()]
    model = args.model or view["model"]
    name = f"rejudge of {args.run_id} by {model}"
    folder = Path(tempfile.mkdtemp(prefix="recallq-rejudge-"))
    source = folder / f"rejudge-{args.run_id}.jsonl"
    try:
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
        url = api_url(args, args.settings)
        if url is not None:
            return _rejudge_remote(args, url, source, model, name, view["scale"])
        return _rejudge_local(args, source, model, name, view["scale"])
    finally:
        source.unlink(missing_ok=True)
        folder.rmdir()


def _rejudge_remote(
    args: argparse.Namespace, url: str, source: Path, model: str, name: str, scale: float
) -> int:

    with Client(url, args.settings.api_key) as client:
        run = client.submit(source, model=model, name=name, scale=scale, claims_from=args.run_id)
        view = wait_for_service_run(run, args.quiet)
        if view is None:
            return Exit.INTERRUPTED
    print_run(view, False, "rejudge")
    print(
        f"recallq: compare the judges with `recallq agreement {run.id} --against {args.run_id}`",
        file=sys.stderr,
    )
    return Exit.OK if view["counts"]["failed"] == 0 else Exit.FAILED


def _rejudge_local(
    args: argparse.Namespace, source: Path, model: str, name: str, scale: float
) -> int:
    run_args = argparse.Namespace(
        file=source,
        model=model,
        name=name,
        context=None,
        context_extractor=None,
        claims_from=args.run_id,
        map=None,
        quiet=args.quiet,
        scale=scale,
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
        settings=args.settings,
    )
    return local_runs.run(run_args)
