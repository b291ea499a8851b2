"""`recallq report` and `recallq run --report` on the local database, as a user runs them: the
file is one page with nothing to fetch, and its numbers are those of `recallq status --json`
and `recallq compare --json`. (tests/browser opens a report in a real browser.)"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

from tests.e2e.test_local_adoption import _rows, _two_retrievers, recallq
from tests.services import REPO


class Elements(HTMLParser):
    """Every start tag with its attributes, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def having(self, attribute: str, value: str | None = None) -> list[dict[str, str | None]]:
        return [
            attrs
            for _, attrs in self.tags
            if attribute in attrs and (value is None or attrs[attribute] == value)
        ]


def parse(path: Path) -> tuple[str, Elements]:
    text = path.read_text(encoding="utf-8")
    elements = Elements()
    elements.feed(text)
    return text, elements


def _counts(elements: Elements) -> dict[str, int]:
    """The counts shown (data-count with data-value: histogram bars have no data-value)."""
    return {
        str(a["data-count"]): int(a["data-value"] or -1)
        for a in elements.having("data-count")
        if "data-value" in a
    }


def assert_self_contained(text: str, elements: Elements) -> None:
    assert [tag for tag, _ in elements.tags if tag in ("script", "link", "iframe", "img")] == []
    assert not re.search(r"(src|href)\s*=\s*\"(https?:)?//", text)
    assert not re.search(r"url\(", text)  # nothing fetched from the stylesheet either
    policy = elements.having("http-equiv", "Content-Security-Policy")
    assert policy and "default-src 'none'" in (policy[0]["content"] or "")


def test_report_of_a_run_and_its_comparison(tmp_path: Path) -> None:
    base_file, candidate_file = _two_retrievers(tmp_path)
    assert recallq("run", str(base_file), "--quiet", cwd=tmp_path).returncode == 0
    assert recallq("run", str(candidate_file), "--quiet", cwd=tmp_path).returncode == 0
    ids = dict(_rows(tmp_path / "recallq.db", "SELECT name, id FROM runs"))
    base, candidate = ids["base.jsonl"], ids["candidate.jsonl"]

    out = tmp_path / "reports" / "ab.html"
    out.parent.mkdir()
    made = recallq(
        "report", candidate, "--compare", base, "--out", str(out), "--lowest", "5", cwd=tmp_path
    )
    assert made.returncode == 0, made.stderr
    assert str(out) in made.stdout
    text, elements = parse(out)
    assert_self_contained(text, elements)

    view = json.loads(recallq("status", candidate, "--json", cwd=tmp_path).stdout)
    [mean] = elements.having("data-testid", "mean-score")
    assert float(mean["data-value"] or "nan") == view["summary"]["mean_score"] == 0.75
    counts = _counts(elements)  # the run's counts, and the comparison's
    assert counts["succeeded"] == view["counts"]["succeeded"] == 40
    # the score histogram's bars, then context precision's
    every_bar = [int(a["data-count"] or -1) for a in elements.having("class", "bar")]
    bars, precision_bars = every_bar[:5], every_bar[5:]
    assert sum(bars) == view["summary"]["scored_items"] == 40
    assert bars == view["summary"]["histogram"]["counts"]
    assert precision_bars == view["summary"]["precision_histogram"]["counts"]

    # the five lowest items, lowest first, each with its claims and verdicts
    shown = [a for a in elements.having("data-item-id") if a.get("class") == "item"]
    assert len(shown) == 5
    results = [
        json.loads(line) for line in recallq("results", candidate, cwd=tmp_path).stdout.splitlines()
    ]
    lowest = sorted(results, key=lambda r: (r["score"], r["index"]))[:5]
    assert [a["data-item-id"] for a in shown] == [r["id"] for r in lowest]
    verdicts = [a["data-verdict"] for a in elements.having("data-claim-index")]
    assert verdicts.count("missing") == 5 and verdicts.count("supported") == 5

    compared = json.loads(recallq("compare", base, candidate, "--json", cwd=tmp_path).stdout)
    [difference] = elements.having("data-testid", "mean-difference")
    assert float(difference["data-value"] or "nan") == compared["mean_difference"] == 0.25
    assert [counts[k] for k in ("improved", "regressed", "unchanged")] == [20, 0, 20]
    points = [a for tag, a in elements.tags if tag == "circle"]
    assert len(points) == 40


def test_run_with_report_writes_it_and_a_plain_run_says_how(tmp_path: Path) -> None:
    example = str(REPO / "examples" / "eval_set.jsonl")
    plain = recallq("run", example, "--quiet", cwd=tmp_path)
    assert plain.returncode == 0
    assert re.search(r"HTML report: recallq report \S+ --out report.html", plain.stdout)
    assert not list(tmp_path.glob("*.html"))

    written = recallq("run", example, "--quiet", "--report", cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    [report] = tmp_path.glob("recallq-report-*.html")
    assert f"HTML report: {report.name}" in written.stdout
    text, elements = parse(report)
    assert_self_contained(text, elements)
    assert len([a for a in elements.having("data-item-id") if a.get("class") == "item"]) == 24

    named = recallq("run", example, "--quiet", "--report", "mine.html", cwd=tmp_path)
    assert named.returncode == 0 and (tmp_path / "mine.html").exists()


def test_report_errors_are_one_line(tmp_path: Path) -> None:
    example = str(REPO / "examples" / "eval_set.jsonl")
    assert recallq("run", example, "--quiet", cwd=tmp_path).returncode == 0
    [(run_id,)] = _rows(tmp_path / "recallq.db", "SELECT id FROM runs")

    unknown = recallq("report", "no-such-run", cwd=tmp_path)
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("recallq: run no-such-run not found")
    assert len(unknown.stderr.splitlines()) == 1

    nowhere = recallq("report", run_id, "--out", str(tmp_path / "missing" / "r.html"), cwd=tmp_path)
    assert nowhere.returncode == 2 and "Traceback" not in nowhere.stderr
    assert "missing" in nowhere.stderr and len(nowhere.stderr.splitlines()) == 1

    too_many = recallq("report", run_id, "--lowest", "100000", cwd=tmp_path)
    assert too_many.returncode == 2 and "must be 1 to 500" in too_many.stderr
    assert not list(tmp_path.glob("*.html"))
