"""A security probe of the labels surfaces: every credential against every label route, hostile
label files, hostile form fields, hostile ids and texts shown on the pages and in the exports.
A real API (keys required), a real worker scoring with the offline judge, Postgres and Redis."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.integration.secured import (
    api_and_worker,
    bearer,
    completed_run,
    error_of,
    key_id_of,
    make_key,
    post_labels,
    recallq,
    secured_env,
    submit,
)

CSRF = re.compile(r'name="csrf_token" value="([^"]*)"')
SAME_SITE = {"Origin": "null", "Sec-Fetch-Site": "same-origin"}
HOSTILE_ID = "=cmd|' /C calc'!A0"
XSS = '<img src=x onerror="alert(1)">'
ITEMS = [
    {"id": "plain", "ground_truth": "Paris is in France. Rome is in Italy.",
     "context": ["Paris is in France."]},
    {"id": HOSTILE_ID, "ground_truth": "=HYPERLINK(\"http://evil.example\") is a claim.",
     "context": ["nothing here"]},
    {"id": "-1", "ground_truth": "Minus one is an id.", "context": ["Minus one is an id."]},
    {"id": f"x{XSS}", "ground_truth": f"{XSS} is shown.", "context": [f"{XSS} context"]},
]  # fmt: skip


@pytest.fixture(scope="module")
def env(service_env: dict[str, str]) -> dict[str, str]:
    return secured_env(service_env, submissions_per_minute=0, max_active_runs_per_project=1000)


@pytest.fixture(scope="module")
def keys(env: dict[str, str]) -> dict[str, str]:
    return {
        "read": make_key(env, "probe", "read", label="probe-read"),
        "write": make_key(env, "probe", "write", label="probe-write"),
        "admin": make_key(env, "probe", "admin", label="probe-admin"),
        "revoked": make_key(env, "probe", "admin", label="probe-revoked"),
        "other_read": make_key(env, "rival", "read", label="rival-read"),
        "other_write": make_key(env, "rival", "write", label="rival-write"),
        "other_admin": make_key(env, "rival", "admin", label="rival-admin"),
    }


@pytest.fixture(scope="module")
def api(env: dict[str, str], keys: dict[str, str]) -> Iterator[str]:
    revoked = recallq(env, "keys", "revoke", key_id_of(env, "probe-revoked"))
    assert revoked.returncode == 0, revoked.stderr
    with api_and_worker(env) as url:
        yield url


def _scored(api: str, key: str, items: list[dict[str, Any]]) -> str:
    return str(completed_run(api, key, {"items": items, "model": "local/lexical"})["id"])


@pytest.fixture(scope="module")
def run(api: str, keys: dict[str, str]) -> str:
    return _scored(api, keys["write"], ITEMS)


@pytest.fixture(scope="module")
def rival_run(api: str, keys: dict[str, str]) -> str:
    return _scored(api, keys["other_write"], ITEMS[:1])


def _path(item_id: str) -> str:
    return quote(item_id, safe="")


def _jsonl(*rows: Any) -> bytes:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode()


# --- credentials × routes --------------------------------------------------------------------


def test_every_credential_on_every_label_route(
    api: str, keys: dict[str, str], run: str, rival_run: str
) -> None:
    label = f"/v1/runs/{run}/items/plain/claims/0/label"
    csv_body = {
        "content": b"item_id,claim_index,verdict\n",
        "headers": {"Content-Type": "text/csv"},
    }
    routes: list[tuple[str, str, dict[str, Any]]] = [
        ("PUT", label, {"json": {"verdict": "yes"}}),
        ("DELETE", label, {}),
        ("GET", f"/v1/runs/{run}/labels", {}),
        ("GET", f"/v1/runs/{run}/labels?format=csv", {}),
        ("POST", f"/v1/runs/{run}/labels", csv_body),
        ("POST", f"/v1/runs/{run}/labels/sample", {"json": {"size": 2}}),
        ("GET", f"/v1/runs/{run}/labels/sample", {}),
        ("GET", f"/v1/runs/{run}/agreement", {}),
    ]  # fmt: skip
    writes = {"PUT", "DELETE", "POST"}
    for method, path, extra in routes:
        headers = extra.pop("headers", {})
        for who, key in [(None, None), ("unknown", "rq_" + "A" * 43), *keys.items()]:
            response = httpx.request(
                method, api + path, headers={**bearer(key), **headers}, timeout=30, **extra
            )
            if who in (None, "unknown", "revoked"):
                expected = 401
            elif who in ("read", "other_read") and method in writes:
                expected = 403  # the role is checked first: the same answer for any run
            elif who is not None and who.startswith("other"):
                expected = 404  # another project's run is no run at all
            else:
                expected = response.status_code if response.status_code < 300 else -1
            assert response.status_code == expected, (method, path, who, response.text)
            if response.status_code >= 400:
                error_of(response)


def test_another_projects_run_cannot_be_reached_through_a_label_route(
    api: str, keys: dict[str, str], run: str, rival_run: str
) -> None:
    mine = bearer(keys["admin"])
    against = httpx.get(f"{api}/v1/runs/{run}/agreement?against={rival_run}", headers=mine)
    assert error_of(against) == (404, "not_found")
    label = httpx.put(
        f"{api}/v1/runs/{rival_run}/items/plain/claims/0/label",
        json={"verdict": "no"},
        headers=mine,
    )
    assert error_of(label) == (404, "not_found")
    sample = httpx.post(f"{api}/v1/runs/{rival_run}/labels/sample", json={"size": 1}, headers=mine)
    assert error_of(sample) == (404, "not_found")
    unchanged = httpx.get(f"{api}/v1/runs/{rival_run}/labels", headers=bearer(keys["other_read"]))
    assert unchanged.json() == {"labels": []}


# --- hostile label files ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "row",
    [
        '{"item_id": "plain", "claim_index": 1e400, "verdict": "yes"}',
        '{"item_id": "plain", "claim_index": -1e400, "verdict": "yes"}',
        '{"item_id": "plain", "claim_index": ' + "9" * 5000 + ', "verdict": "yes"}',
        '{"item_id": "plain", "claim_index": NaN, "verdict": "yes"}',
        '{"item_id": "plain", "claim_index": -1, "verdict": "yes"}',
        '{"item_id": "plain", "claim_index": "0x1", "verdict": "yes"}',
        '{"item_id": "pl\\u0000ain", "claim_index": 0, "verdict": "yes"}',
        '{"item_id": "pl\\ud800ain", "claim_index": 0, "verdict": "yes"}',
        '{"claim": "Pa\\u0000ris", "verdict": "yes"}',
        '{"claim": "Pa\\udfffris", "verdict": "yes"}',
        '{"item_id": ["plain"], "claim_index": 0, "verdict": "yes"}',
        '{"item_id": {"a": 1}, "claim_index": {"b": 2}, "verdict": "yes"}',
        '{"item_id": "plain", "claim_index": 0, "verdict": "yes", "note": "n\\u0000"}',
        '{"item_id": "plain", "claim_index": 0, "verdict": "yes", "note": "\\ud800"}',
        '{"item_id": "plain", "claim_index": 0, "verdict": ["yes"]}',
        '{"item_id": "' + "i" * 100_000 + '", "claim_index": 0, "verdict": "yes"}',
        "[" * 100_000,
    ],
)
def test_a_hostile_jsonl_row_is_a_problem_of_its_line_and_the_good_row_stands(
    api: str, keys: dict[str, str], run: str, row: str
) -> None:
    data = _jsonl({"item_id": "plain", "claim_index": 0, "verdict": "no"}, row)
    response = post_labels(api, keys["write"], run, data, "application/x-ndjson")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["stored"] == 1, body
    assert [p["line"] for p in body["problems"]] == [2], body


@pytest.mark.parametrize(
    "cells",
    [
        "pl\x00ain,0,yes",
        "plain,\x00,yes",
        "plain,²,yes",
        "plain,0,yes,extra",
        "plain,-0,yes",
    ],
)
def test_a_hostile_csv_row_is_a_problem_of_its_line(
    api: str, keys: dict[str, str], run: str, cells: str
) -> None:
    data = f"item_id,claim_index,verdict\nplain,0,no\n{cells}\n".encode()
    response = post_labels(api, keys["write"], run, data, "text/csv")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["stored"] == 1 and [p["line"] for p in body["problems"]] == [3], body


def test_a_file_naming_more_items_than_a_query_can_bind_is_answered(
    api: str, keys: dict[str, str], run: str
) -> None:
    """70,000 distinct unknown ids (under the row limit): every one a problem, not a 500."""
    rows = "".join(f"u{i},0,yes\n" for i in range(70_000))
    data = ("item_id,claim_index,verdict\nplain,0,no\n" + rows).encode()
    response = post_labels(api, keys["write"], run, data, "text/csv")
    assert response.status_code == 200, response.text[:500]
    body = response.json()
    assert body["stored"] == 1 and body["problems_total"] == 70_000, body["problems"][:3]


def test_an_oversized_file_is_a_413_and_an_undecodable_line_a_problem_of_its_own(
    api: str, keys: dict[str, str], run: str
) -> None:
    big = b"item_id,claim_index,verdict\n" + b"x" * (10 * 1024 * 1024)
    assert error_of(post_labels(api, keys["write"], run, big, "text/csv"))[0] == 413
    bad = b"item_id,claim_index,verdict\n\xff\xfe,0,yes\nplain,0,no\n"
    response = post_labels(api, keys["write"], run, bad, "text/csv")
    assert response.status_code == 200, response.text
    assert response.json()["problems"] == [{"line": 2, "problem": "not UTF-8 text (byte 0xff)"}]
    assert response.json()["stored"] == 1
    rows = b"item_id,claim_index,verdict\n" + b"a,0,\n" * 100_001
    assert error_of(post_labels(api, keys["write"], run, rows, "text/csv"))[0] == 413


# --- exports ---------------------------------------------------------------------------------


def test_the_sample_file_round_trips_ids_a_spreadsheet_would_run(
    api: str, keys: dict[str, str], run: str
) -> None:
    """The sample CSV makes `=cmd…` and `-1` safe for a spreadsheet; the filled-in file must
    still name those items when imported back."""
    write = bearer(keys["write"])
    drawn = httpx.post(f"{api}/v1/runs/{run}/labels/sample", json={"size": 10}, headers=write)
    assert drawn.status_code == 200, drawn.text
    sheet = httpx.get(f"{api}/v1/runs/{run}/labels/sample?format=csv", headers=write).text
    rows = list(csv.DictReader(io.StringIO(sheet)))
    for row in rows:
        for value in row.values():
            assert not value.startswith(("=", "+", "-", "@", "\t", "\r")), value
        row["human_verdict"] = "yes"
        row["note"] = "=1+1"
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    response = post_labels(api, keys["write"], run, out.getvalue().encode(), "text/csv")
    assert response.status_code == 200, response.text
    assert response.json()["problems"] == [] and response.json()["stored"] == len(rows)
    ids = {
        label["item_id"]
        for label in httpx.get(f"{api}/v1/runs/{run}/labels", headers=write).json()["labels"]
    }
    assert {HOSTILE_ID, "-1"} <= ids, ids
    export = httpx.get(f"{api}/v1/runs/{run}/labels?format=csv", headers=write).text
    for row in csv.DictReader(io.StringIO(export)):
        for value in row.values():
            assert not value.startswith(("=", "+", "-", "@", "\t", "\r")), value


# --- pages -----------------------------------------------------------------------------------


@contextmanager
def _signed_in(api: str, key: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api, timeout=30) as client:
        response = client.post("/signin", data={"key": key, "next": "/"})
        assert response.status_code == 303, response.text
        yield client


def _csrf(client: httpx.Client, path: str) -> str:
    page = client.get(path)
    assert page.status_code == 200, page.text
    match = CSRF.search(page.text)
    assert match is not None
    return match.group(1)


@pytest.mark.parametrize(
    "field,value",
    [
        ("claim_index", "²"),
        ("claim_index", "\u0661"),  # an Arabic-Indic 1, which int() takes
        ("item_id", "pl\x00ain"),
        ("note", "n" * 5000),
        ("note", "bad\x00note"),
        ("verdict", "maybe"),
    ],
)
def test_a_hostile_label_form_is_a_400_page(
    api: str, keys: dict[str, str], run: str, field: str, value: str
) -> None:
    with _signed_in(api, keys["write"]) as client:
        token = _csrf(client, f"/runs/{run}/label")
        form = {"csrf_token": token, "item_id": "plain", "claim_index": "0", "verdict": "yes"}
        form[field] = value
        response = client.post(f"/runs/{run}/label", data=form, headers=SAME_SITE)
        assert response.status_code in (400, 404, 413), response.text[:300]


@pytest.mark.parametrize("query", ["at=²", "prev=²", "at=99999999", "at=-1", "at=1e3"])
def test_a_hostile_label_page_position_is_a_400_page(
    api: str, keys: dict[str, str], run: str, query: str
) -> None:
    with _signed_in(api, keys["read"]) as client:
        assert client.get(f"/runs/{run}/label").status_code == 200
        response = client.get(f"/runs/{run}/label?{query}")
        assert response.status_code == 400, response.text[:300]


@pytest.mark.parametrize("size", ["²", "0", "99999999", "-1", ""])
def test_a_hostile_sample_form_is_a_400_page(
    api: str, keys: dict[str, str], run: str, size: str
) -> None:
    with _signed_in(api, keys["write"]) as client:
        token = _csrf(client, f"/runs/{run}/label")
        form = {"csrf_token": token, "size": size}
        response = client.post(f"/runs/{run}/label/sample", data=form, headers=SAME_SITE)
        assert response.status_code == 400, response.text[:300]


def test_forged_and_cross_site_label_posts_are_refused(
    api: str, keys: dict[str, str], run: str
) -> None:
    with _signed_in(api, keys["write"]) as client:
        token = _csrf(client, f"/runs/{run}/label")
        form = {"csrf_token": token, "item_id": "plain", "claim_index": "0", "verdict": "yes"}
        forged = client.post(
            f"/runs/{run}/label", data={**form, "csrf_token": "x"}, headers=SAME_SITE
        )
        cross = client.post(
            f"/runs/{run}/label", data=form, headers={"Origin": "https://evil.example"}
        )
        site = client.post(
            f"/runs/{run}/label", data=form, headers={"Sec-Fetch-Site": "cross-site"}
        )
        assert [forged.status_code, cross.status_code, site.status_code] == [403, 403, 403]
    with _signed_in(api, keys["read"]) as client:
        token = _csrf(client, f"/runs/{run}/label")
        read = client.post(
            f"/runs/{run}/label", data={**form, "csrf_token": token}, headers=SAME_SITE
        )
        assert read.status_code == 403
    with _signed_in(api, keys["other_admin"]) as client:
        token = _csrf(client, "/")
        rival = client.post(
            f"/runs/{run}/label", data={**form, "csrf_token": token}, headers=SAME_SITE
        )
        assert rival.status_code == 404


def test_hostile_text_is_escaped_on_the_label_and_item_pages(
    api: str, keys: dict[str, str], run: str
) -> None:
    item = f"x{XSS}"
    put = httpx.put(
        f"{api}/v1/runs/{run}/items/{_path(item)}/claims/0/label",
        json={"verdict": "no", "note": f"</textarea>{XSS}<script>alert(2)</script>"},
        headers=bearer(keys["write"]),
    )
    assert put.status_code == 200, put.text
    with _signed_in(api, keys["read"]) as client:
        pages = [client.get(f"/runs/{run}/items/{_path(item)}")]
        steps = client.get(f"/runs/{run}/label")
        assert steps.status_code == 200
        for at in range(12):
            page = client.get(f"/runs/{run}/label?at={at}&prev={at}")
            if page.status_code == 200:
                pages.append(page)
        for page in pages:
            assert page.status_code == 200, page.text[:200]
            assert (
                "onerror="
                not in page.text.replace("onerror=&#34;", "").replace("onerror=&quot;", "")
                or "<img src=x onerror" not in page.text
            )
            assert "<script>alert(2)" not in page.text and "<img src=x" not in page.text


# --- /metrics --------------------------------------------------------------------------------


def _series(api: str) -> set[str]:
    page = httpx.get(f"{api}/metrics")
    assert page.status_code == 200, page.text
    return {line.rsplit(" ", 1)[0] for line in page.text.splitlines() if not line.startswith("#")}


def test_metrics_carry_no_id_key_or_text_and_clients_cannot_add_series(
    api: str, env: dict[str, str], keys: dict[str, str], run: str, rival_run: str
) -> None:
    write = bearer(keys["write"])
    httpx.put(
        f"{api}/v1/runs/{run}/items/plain/claims/0/label", json={"verdict": "yes"}, headers=write
    )
    before = _series(api)
    for attempt in range(3):  # hostile requests of every kind, each kind twice at least
        for model in ["evil/" + "m" * 150, f"openai/{run}", "../../etc/passwd", "local/lexical\n"]:
            refused = submit(api, keys["write"], {"items": ITEMS[:1], "model": model})
            assert refused.status_code in (400, 422), refused.text
        for method in ["PROPFIND", "BREW", "GET", "TRACE"]:
            httpx.request(method, f"{api}/v1/runs/{run}/labels/x{attempt}", headers=write)
            httpx.request(method, f"{api}/runs/{run}/label/{attempt}", headers=write)
        httpx.get(f"{api}/v1/runs/{run}/items/{_path(HOSTILE_ID)}/claims/{attempt}/label")
        httpx.get(
            f"{api}/v1/runs/{run}/agreement?by=topic{attempt}&against={rival_run}", headers=write
        )
    after = _series(api)
    added = after - before
    page = httpx.get(f"{api}/metrics").text
    secrets = [run, rival_run, *keys.values(), "plain", "Paris", "etc/passwd", "mmmmmmmm"]
    secrets += [key_id_of(env, name) for name in ("probe-write", "rival-write")]
    secrets += [env["RECALLQ_DATABASE_URL"], env["STUB_API_KEY"], "onerror"]
    for secret in secrets:
        assert secret not in page, secret
    # what the hostile requests may add: a series per route template, method and status
    routes = {re.search(r'route="([^"]*)"', s).group(1) for s in added if "route=" in s}  # type: ignore[union-attr]
    methods = {re.search(r'method="([^"]*)"', s).group(1) for s in added if "method=" in s}  # type: ignore[union-attr]
    assert methods <= {"GET", "POST", "other"}, methods
    assert all(r.startswith("/") or r == "unmatched" for r in routes), routes
    assert len(routes) <= 6, routes


def test_agreement_by_a_field_with_a_value_per_item_is_a_422_not_minutes_of_cpu(
    api: str, keys: dict[str, str]
) -> None:
    """Each group of `by=` is a bootstrap of its own: a field with a value per item (an id)
    let a read key spend minutes of API CPU per request."""
    items = [
        {"id": f"g{i}", "ground_truth": f"Fact {i} holds.", "context": [f"Fact {i} holds."],
         "unique": f"u{i}", "half": i % 2}
        for i in range(120)
    ]  # fmt: skip
    run = _scored(api, keys["write"], items)
    rows = "".join(f"g{i},0,{'yes' if i % 3 else 'no'}\n" for i in range(120))
    stored = post_labels(
        api, keys["write"], run, f"item_id,claim_index,verdict\n{rows}".encode(), "text/csv"
    )
    assert stored.status_code == 200 and stored.json()["stored"] == 120, stored.text
    read = bearer(keys["read"])
    refused = httpx.get(f"{api}/v1/runs/{run}/agreement?by=unique", headers=read, timeout=120)
    assert error_of(refused) == (422, "invalid_request")
    assert "120 values" in refused.json()["error"]["message"]
    split = httpx.get(f"{api}/v1/runs/{run}/agreement?by=half", headers=read, timeout=120)
    assert split.status_code == 200, split.text
    assert sorted(split.json()["by_group"]) == ["0", "1"]
    assert split.json()["labelled_claims"] == 120


def test_the_sample_file_is_read_in_pages_with_every_claim_once_in_the_drawn_order(
    api: str, keys: dict[str, str]
) -> None:
    """The sample file is streamed a few items at a time (each row repeats its item's
    passages: a large sample was gigabytes held at once; bench/sample_file.py)."""
    items = [
        {"id": f"p{i}", "ground_truth": f"Fact {i} holds. Fact {i} stays.",
         "context": [f"Fact {i} holds."]}
        for i in range(25)
    ]  # fmt: skip
    run = _scored(api, keys["write"], items)
    write = bearer(keys["write"])
    drawn = httpx.post(
        f"{api}/v1/runs/{run}/labels/sample", json={"size": 25, "seed": 3}, headers=write
    )
    order = drawn.json()["item_ids"]
    sheet = httpx.get(f"{api}/v1/runs/{run}/labels/sample?format=csv", headers=write)
    assert sheet.status_code == 200 and sheet.headers["content-type"].startswith("text/csv")
    assert sheet.text.count("item_id,claim_index") == 1
    rows = list(csv.DictReader(io.StringIO(sheet.text)))
    assert [(r["item_id"], r["claim_index"]) for r in rows] == [
        (key, str(index)) for key in order for index in range(2)
    ]
    assert all(r["context"] == f"[0] Fact {r['item_id'][1:]} holds." for r in rows)


def test_the_labels_export_is_read_in_pages_with_every_label_once_in_order(
    api: str, keys: dict[str, str]
) -> None:
    """More labels than one page of the export (1,000), in JSON, JSONL and CSV."""
    items = [
        {"id": f"e{i}", "ground_truth": f"Fact {i} holds. Fact {i} stays.",
         "context": [f"Fact {i} holds."]}
        for i in range(600)
    ]  # fmt: skip
    run = _scored(api, keys["write"], items)
    rows = "".join(
        f"e{i},{k},{'yes' if (i + k) % 2 else 'no'},=n{i}\n" for i in range(600) for k in (0, 1)
    )
    stored = post_labels(
        api, keys["write"], run, f"item_id,claim_index,verdict,note\n{rows}".encode(), "text/csv"
    )
    assert stored.json()["stored"] == 1200, stored.text[:300]
    expected = [(f"e{i}", k) for i in range(600) for k in (0, 1)]
    read = bearer(keys["read"])
    url = f"{api}/v1/runs/{run}/labels"
    as_json = httpx.get(url, headers=read, timeout=120)
    assert as_json.headers["content-type"].startswith("application/json")
    assert [(x["item_id"], x["claim_index"]) for x in as_json.json()["labels"]] == expected
    assert as_json.json()["labels"][0]["note"] == "=n0"
    jsonl = httpx.get(url + "?format=jsonl", headers=read, timeout=120).text.splitlines()
    assert [(x["item_id"], x["claim_index"]) for x in map(json.loads, jsonl)] == expected
    sheet = httpx.get(url + "?format=csv", headers=read, timeout=120).text
    assert sheet.count("item_id,claim_index") == 1
    table = list(csv.DictReader(io.StringIO(sheet)))
    assert [(r["item_id"], int(r["claim_index"])) for r in table] == expected
    assert table[0]["note"] == "'=n0"  # spreadsheet-safe


def test_rows_naming_a_claim_by_its_text_alone(api: str, keys: dict[str, str]) -> None:
    """Only the claims of the texts named are read (not every claim of the run), with the
    same answers: a unique text is stored, a text two items share and an unknown text are
    problems, a spreadsheet-safe cell finds its claim."""
    items = [
        {"id": "t0", "ground_truth": "Shared fact here. Only in zero.", "context": ["x"]},
        {"id": "t1", "ground_truth": "Shared fact here. =SUM(A1) is odd.", "context": ["x"]},
    ]
    run = _scored(api, keys["write"], items)
    got = httpx.get(f"{api}/v1/runs/{run}/items/t1", headers=bearer(keys["read"])).json()
    texts = [claim["text"] for claim in got["claims"]]
    shared, formula = texts[0], texts[1]
    assert formula.startswith("=")
    zero = httpx.get(f"{api}/v1/runs/{run}/items/t0", headers=bearer(keys["read"])).json()
    only = zero["claims"][1]["text"]
    rows = [
        {"claim": only, "verdict": "yes"},
        {"claim": shared, "verdict": "no"},
        {"claim": "no such claim", "verdict": "no"},
        {"claim": "'" + formula, "verdict": "no"},
        {"item_id": "t0", "claim": shared, "verdict": "yes"},
        {"claim": "bad\u0000text", "verdict": "yes"},
    ]
    response = post_labels(api, keys["write"], run, _jsonl(*rows), "application/x-ndjson")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["stored"] == 3, body
    assert [p["line"] for p in body["problems"]] == [2, 3, 6], body
    assert "2 claims" in body["problems"][0]["problem"]
    labels = httpx.get(f"{api}/v1/runs/{run}/labels", headers=bearer(keys["read"])).json()
    assert sorted((x["item_id"], x["claim"], x["verdict"]) for x in labels["labels"]) == sorted(
        [("t0", only, "yes"), ("t1", formula, "no"), ("t0", shared, "yes")]
    )
