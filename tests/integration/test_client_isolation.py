"""Nothing one client does hurts the API (issue 19, items 4-8), against a real API process on
Postgres and Redis of the test session's own:

- a stalled /results reader holds a bounded number of bytes, and a key a bounded number of
  streams (429 beyond);
- crafted cursors, sorts and filters are 4xx on every page (and fuzzed: no 5xx);
- item ids with `/` work in the API, the pages, their links and `recallq report`;
- with auth off, other Host names are refused and a body must say it is JSON or NDJSON;
- `scale` has a lower bound, in the served schema too.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import httpx
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.secured import bearer, make_key, recallq, secured_env
from tests.services import Process, start_api, start_worker, wait_for_run


@pytest.fixture(scope="module")
def api(service_env: dict[str, str]) -> Iterator[str]:
    """An API with auth off (one project) and a worker scoring with local/lexical."""
    worker = start_worker(service_env, concurrency=4)
    process, url = start_api(service_env)
    yield url
    process.stop()
    worker.stop()
    assert "Traceback" not in process.output()


def _submit(api: str, items: list[dict[str, Any]], **fields: Any) -> str:
    response = httpx.post(f"{api}/v1/runs", json={"items": items, **fields}, timeout=60)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def _b64(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode()


SLASHED = [
    {"id": "docs/q1", "ground_truth": "Paris is in France.", "context": ["Paris is in France."]},
    {"id": "docs/a_2fb", "ground_truth": "Rome is in Italy.", "context": ["Nothing here."]},
    {"id": "plain", "ground_truth": "Oslo is in Norway.", "context": ["Oslo is in Norway."]},
]


@pytest.fixture(scope="module")
def scored(api: str) -> dict[str, str]:
    """Two scored runs of the same items, ids with `/` among them."""
    runs = {"base": _submit(api, SLASHED, name="slashed-base")}
    runs["candidate"] = _submit(api, SLASHED, name="slashed-candidate")
    for run_id in runs.values():
        assert wait_for_run(api, run_id)["status"] == "completed"
    return runs


# --- item 5: crafted cursors --------------------------------------------------------------


def test_crafted_page_cursors_are_400_not_500(api: str, scored: dict[str, str]) -> None:
    run = scored["base"]
    past_int = "W251bGwsIDIxNDc0ODM2NDhd"  # [null, 2147483648]: past an INTEGER
    null_score = "W251bGwsIDFd"  # [null, 1] on a page sorted by score
    assert base64.urlsafe_b64decode(past_int) == b"[null, 2147483648]"
    for query in (
        f"cursor={past_int}",
        f"sort=score&cursor={null_score}",
        f"sort=-score&cursor={null_score}",
        f"sort=score&cursor={_b64([10**400, 1])}",
        f"cursor={_b64(['x', 1])}",
        "sort=nope",
        "min_score=NaN",
    ):
        page = httpx.get(f"{api}/runs/{run}/items?{query}", timeout=30)
        assert page.status_code == 400, (query, page.status_code)
    for cursor in ("1u.a\u0000b", "1u." + "x" * 100, "99999999999999999u.x", _b64(["2026", "x"])):
        assert httpx.get(f"{api}/", params={"cursor": cursor}, timeout=30).status_code == 400
    assert httpx.get(f"{api}/v1/runs/{run}/items?cursor={past_int}").status_code == 422
    # a cursor this site made still works
    made = _b64([0.0, 0])
    assert httpx.get(f"{api}/runs/{run}/items?sort=score&cursor={made}").status_code == 200


PAGE_PARAMS = {
    "/": ("status", "name", "cursor"),
    "/runs/{run}": ("by", "done"),
    "/runs/{run}/items": ("status", "min_score", "max_score", "q", "sort", "cursor"),
    "/runs/{run}/items/{item}": (),
    "/compare": ("base", "candidate"),
    "/compare/items/{item}": ("base", "candidate"),
}
cursors = st.one_of(
    st.builds(
        _b64,
        st.lists(
            st.one_of(
                st.none(),
                st.booleans(),
                st.integers(min_value=-(2**70), max_value=2**70),
                st.floats(allow_nan=False, allow_infinity=False),
                st.text(max_size=30),
            ),
            max_size=3,
        ),
    ),
    st.text(max_size=80),
)
values = st.one_of(
    st.text(max_size=250),
    cursors,
    st.sampled_from(["score", "-score", "succeeded", "failed", "0", "1", "-1", "1e999"]),
)


@pytest.mark.slow
def test_fuzzing_the_pages_query_parameters_finds_no_5xx(api: str, scored: dict[str, str]) -> None:
    """What schemathesis does for the served spec, for the pages (which are not in it)."""
    client = httpx.Client(base_url=api, timeout=30)
    runs = [scored["base"], scored["candidate"]]

    @settings(
        max_examples=300,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(
        path=st.sampled_from(sorted(PAGE_PARAMS)),
        item=st.one_of(st.sampled_from([i["id"] for i in SLASHED]), st.text(min_size=1)),
        chosen=st.dictionaries(
            st.sampled_from(sorted({p for v in PAGE_PARAMS.values() for p in v})),
            st.one_of(values, st.sampled_from(runs)),
            max_size=4,
        ),
        run=st.sampled_from(runs),
    )
    def probe(path: str, item: str, chosen: dict[str, str], run: str) -> None:
        url = path.format(run=run, item=quote(item, safe=""))
        params = {name: value for name, value in chosen.items() if name in PAGE_PARAMS[path]}
        response = client.get(url, params=params)
        assert response.status_code < 500, (url, params, response.status_code)

    try:
        probe()
    finally:
        client.close()


# --- item 6: ids with `/` -----------------------------------------------------------------


def test_an_item_id_with_a_slash_works_everywhere(
    api: str, scored: dict[str, str], service_env: dict[str, str], tmp_path: Path
) -> None:
    base, candidate = scored["base"], scored["candidate"]
    for path in ("docs/q1", "docs%2Fq1"):
        item = httpx.get(f"{api}/v1/runs/{base}/items/{path}", timeout=30)
        assert item.status_code == 200, (path, item.text)
        assert item.json()["id"] == "docs/q1" and item.json()["claims"]
    assert httpx.get(f"{api}/v1/runs/{base}/items/docs/q2").status_code == 404
    # the items page links to each item's page, and the link opens it
    table = httpx.get(f"{api}/runs/{base}/items", timeout=30).text
    links = re.findall(r'href="(/runs/[^"]+/items/[^"]+)"', table)
    assert f"/runs/{base}/items/docs%2Fq1" in links
    for link in links:
        page = httpx.get(f"{api}{link}", timeout=30)
        assert page.status_code == 200, link
    assert "docs/q1" in httpx.get(f"{api}/runs/{base}/items/docs/q1").text
    compared = httpx.get(
        f"{api}/compare/items/docs%2Fa_2fb", params={"base": base, "candidate": candidate}
    )
    assert compared.status_code == 200 and "docs/a_2fb" in compared.text
    # the report reads every item through the API, and keeps `a/b` and `a_2fb` apart
    out = tmp_path / "report.html"
    env = {**service_env, "RECALLQ_API_URL": api}
    done = recallq(env, "report", base, "--out", str(out), "--compare", candidate)
    assert done.returncode == 0, done.stderr
    html = out.read_text()
    anchors = re.findall(r'<a href="#(item-[^"]+)">', html)
    assert len(anchors) == len(set(anchors)) == len(SLASHED)
    for anchor in anchors:
        assert f'id="{anchor}"' in html


# --- item 7: auth off: Host names and body types -------------------------------------------


def test_with_auth_off_other_host_names_are_refused(api: str) -> None:
    port = urlparse(api).port
    hostile = [
        "evil.example",
        f"evil.example:{port}",
        "127.0.0.1.evil.example",
        f"localhost:{port}@evil.example",  # issue 28: a Host that only starts like localhost
        f"localhost:{port} evil.example",
    ]
    for host in hostile:
        refused = httpx.get(f"{api}/v1/runs", headers={"Host": host})
        assert refused.status_code == 421, host
        assert refused.json()["error"]["code"] == "misdirected_request"
        assert httpx.get(f"{api}/", headers={"Host": host}).status_code == 421
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "LOCALHOST", f"[::1]:{port}"):
        assert httpx.get(f"{api}/v1/runs", headers={"Host": host}).status_code == 200, host


def test_a_body_must_say_it_is_json_or_ndjson(api: str) -> None:
    body = json.dumps({"items": SLASHED}).encode()
    before = len(httpx.get(f"{api}/v1/runs", params={"limit": 100}).json()["runs"])
    # what a page on another site can send without a preflight: no type (a Blob), text/plain,
    # a form
    for headers in ({}, {"content-type": "text/plain"}, {"content-type": "multipart/form-data"}):
        refused = httpx.post(f"{api}/v1/runs", content=body, headers=headers)
        assert refused.status_code == 415, (headers, refused.text)
        assert refused.json()["error"]["code"] == "unsupported_media_type"
    refused = httpx.post(f"{api}/v1/runs/x/cancel", content=b"{}", headers={"content-type": ""})
    assert refused.status_code == 415
    assert len(httpx.get(f"{api}/v1/runs", params={"limit": 100}).json()["runs"]) == before
    typed = {"content-type": "application/json; charset=utf-8"}
    assert httpx.post(f"{api}/v1/runs", content=body, headers=typed).status_code == 202


# --- item 8: the scale ------------------------------------------------------------------------


def test_scale_has_a_lower_bound_in_the_server_and_in_its_schema(api: str) -> None:
    for scale in (5e-324, 0.001, 0):
        refused = httpx.post(f"{api}/v1/runs", json={"items": SLASHED, "scale": scale})
        assert refused.status_code == 422, scale
        assert "scale" in refused.json()["error"]["message"]
    assert httpx.post(f"{api}/v1/runs", json={"items": SLASHED, "scale": 0.01}).status_code == 202
    ndjson = {"content-type": "application/x-ndjson"}
    line = (json.dumps(SLASHED[0]) + "\n").encode()
    tiny = httpx.post(f"{api}/v1/runs?scale=5e-324", content=line, headers=ndjson)
    assert tiny.status_code == 422
    spec = httpx.get(f"{api}/openapi.json").json()
    field = spec["components"]["schemas"]["RunSubmission"]["properties"]["scale"]
    (scale,) = [kind for kind in field["anyOf"] if kind["type"] == "number"]  # or null: 1
    assert scale["minimum"] == 0.01 and "exclusiveMinimum" not in scale
    (query,) = [p for p in spec["paths"]["/v1/runs"]["post"]["parameters"] if p["name"] == "scale"]
    assert query["schema"]["minimum"] == 0.01


# --- item 4: stalled result readers -----------------------------------------------------------

STALL_TIMEOUT = 25  # longer than the test takes to look at its stalled readers
BIG_ITEMS = 600
ITEM_BYTES = 50_000  # a 30 MB run: a 500-item page of it is 25 MB of text


@pytest.fixture(scope="module")
def keyed(service_env: dict[str, str]) -> Iterator[tuple[str, Process, dict[str, str]]]:
    env = secured_env(
        service_env,
        submissions_per_minute=0,
        max_active_runs_per_project=1000,
        max_result_streams_per_key=3,
        results_stall_timeout=STALL_TIMEOUT,
    )
    keys = {name: make_key(env, "streams", "write", label=f"streams {name}") for name in "abc"}
    process, url = start_api(env)
    yield url, process, keys
    process.stop()
    assert "Traceback" not in process.output()


def _big_run(url: str, key: str) -> str:
    filler = "x" * ITEM_BYTES
    lines = "".join(
        json.dumps({"id": f"b{i}", "ground_truth": f"Fact {i}.", "context": [filler]}) + "\n"
        for i in range(BIG_ITEMS)
    )
    response = httpx.post(
        f"{url}/v1/runs",
        content=lines.encode(),
        headers={**bearer(key), "content-type": "application/x-ndjson"},
        timeout=300,
    )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def _stalled_reader(url: str, path: str, key: str) -> socket.socket:
    """A client that asks for the results, reads their first bytes, then reads no more."""
    parsed = urlparse(url)
    reader = socket.create_connection((parsed.hostname, parsed.port))
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    request = f"GET {path} HTTP/1.1\r\nHost: {parsed.netloc}\r\nAuthorization: Bearer {key}\r\n\r\n"
    reader.sendall(request.encode())
    head = reader.recv(1024)
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    return reader


def test_stalled_result_readers_hold_bounded_memory_and_streams(
    keyed: tuple[str, Process, dict[str, str]],
) -> None:
    url, process, keys = keyed
    run_id = _big_run(url, keys["a"])
    made = httpx.post(
        f"{url}/v1/runs", json={"items": SLASHED}, headers=bearer(keys["c"]), timeout=60
    )
    small = made.json()["id"]
    # the whole stream, cut into pages by bytes, has every item once, in order
    with httpx.stream(
        "GET", f"{url}/v1/runs/{run_id}/results", headers=bearer(keys["c"]), timeout=120
    ) as whole:
        ids = [json.loads(line)["id"] for line in whole.iter_lines() if line]
    assert ids == [f"b{i}" for i in range(BIG_ITEMS)]
    api = psutil.Process(process.proc.pid)
    rss_before = api.memory_info().rss
    readers = [
        _stalled_reader(url, f"/v1/runs/{run_id}/results", keys[name])
        for name in ("a", "a", "a", "b", "b", "b")
    ]
    try:
        # each reader's stream runs until the server's buffers for it are full: let it get there
        peak = rss_before
        for _ in range(20):
            time.sleep(0.5)
            peak = max(peak, api.memory_info().rss)
        grown = (peak - rss_before) / 2**20
        print(f"API RSS {rss_before / 2**20:.0f} MB -> peak {peak / 2**20:.0f} MB with 6 stalled")
        assert grown < 100, f"6 stalled readers of a 30 MB run grew the API by {grown:.0f} MB"
        # a fourth stream of one key is refused; other keys and other reads still answer
        refused = httpx.get(f"{url}/v1/runs/{run_id}/results", headers=bearer(keys["a"]))
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "too_many_streams"
        read = httpx.get(f"{url}/v1/runs/{small}", headers=bearer(keys["c"]), timeout=30)
        assert read.status_code == 200
        # a closed reader gives its key's slot back
        for reader in readers[3:]:
            reader.close()
        _wait_for_a_stream(url, keys["b"], small)
        # and a reader that stays stalled is cut after RECALLQ_RESULTS_STALL_TIMEOUT
        _wait_for_a_stream(url, keys["a"], small, timeout=STALL_TIMEOUT + 30)
        assert "its stream ends" in process.output()
    finally:
        for reader in readers:
            reader.close()


def _wait_for_a_stream(url: str, key: str, run_id: str, timeout: float = 30) -> None:
    """Until the key may open a stream again (bounded), which then has every item."""
    deadline = time.monotonic() + timeout
    while True:
        with httpx.stream(
            "GET", f"{url}/v1/runs/{run_id}/results", headers=bearer(key), timeout=30
        ) as again:
            if again.status_code == 200:
                assert len([line for line in again.iter_lines() if line]) == len(SLASHED)
                return
            assert again.status_code == 429
        assert time.monotonic() < deadline, "the key's slots were never given back"
        time.sleep(0.5)
