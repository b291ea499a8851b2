"""The served OpenAPI document is true: it describes the bodies, responses, error shape,
status codes and bearer scheme; /docs loads nothing from another site; 405 says `Allow`, the
label routes' too; a run not found is worded once everywhere. And schemathesis, fuzzing the
running API from that document with every check it has, finds nothing: no 5xx, no response
the document does not describe, no valid request refused, no invalid one accepted.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from recallq.labels import store as labels
from tests.integration.secured import bearer, error_of, make_key, secured_env
from tests.services import REPO, Process, start_api

# every check schemathesis has: the document states what the server does, the server does
# what the document states (tests/schemathesis.toml says which 422s a valid submission may get)
CONFIG = REPO / "tests" / "schemathesis.toml"
FUZZ_SECONDS = int(os.environ.get("RECALLQ_FUZZ_SECONDS", "150"))


@pytest.fixture(scope="module")
def env(service_env: dict[str, str]) -> dict[str, str]:
    return secured_env(service_env, submissions_per_minute=0, max_active_runs_per_project=100000)


@pytest.fixture(scope="module")
def served(env: dict[str, str]) -> Iterator[tuple[str, str, Process]]:
    key = make_key(env, "openapi", "admin")
    process, url = start_api(env)
    yield url, key, process
    process.stop()


@pytest.fixture(scope="module")
def spec(served: tuple[str, str, Process]) -> dict[str, Any]:
    return httpx.get(f"{served[0]}/openapi.json").json()


def _operations(spec: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            yield path, method, operation


def test_the_submission_body_is_described_as_json_and_ndjson(spec: dict[str, Any]) -> None:
    body = spec["paths"]["/v1/runs"]["post"]["requestBody"]
    assert body["required"] is True
    assert set(body["content"]) == {"application/json", "application/x-ndjson"}
    submission = spec["components"]["schemas"]["RunSubmission"]
    assert submission["required"] == ["items"] and submission["additionalProperties"] is False
    assert {"budget_usd", "budget_tokens", "context_extractor"} <= set(submission["properties"])
    responses = spec["paths"]["/v1/runs"]["post"]["responses"]
    assert set(responses) >= {"200", "202", "400", "401", "403", "408", "413", "415", "422", "429"}


def test_the_schema_states_the_bounds_the_server_checks(spec: dict[str, Any]) -> None:
    """Bounds schemathesis' positive_data_acceptance found the schema leaving out: a seed of
    2**62 (FastAPI serves bounds as floats: a seed past it was generated as valid, and
    refused), and NUL in a note or a run id."""
    sample = spec["components"]["schemas"]["SampleBody"]["properties"]["seed"]
    assert sample["maximum"] == labels.MAX_SEED == 2**53 - 1  # a float holds the next int too
    no_nul = "^[^\\u0000]*$"
    note = spec["components"]["schemas"]["LabelBody"]["properties"]["note"]
    assert note["pattern"] == no_nul  # beside anyOf: a string must match it, null need not
    parameters = spec["paths"]["/v1/runs/{run_id}/agreement"]["get"]["parameters"]
    (against,) = [p for p in parameters if p["name"] == "against"]
    assert against["schema"]["pattern"] == no_nul
    # issue 28: allowed by the document, refused by the server
    components = spec["components"]["schemas"]
    tools = components["ToolResultsExtractor"]["properties"]["tools"]["anyOf"][0]
    assert tools["minItems"] == 1 and tools["items"]["pattern"] == "\\S"
    submitted = spec["paths"]["/v1/runs"]["post"]["parameters"]
    (extractor,) = [p for p in submitted if p["name"] == "context_extractor"]
    assert "schema" not in extractor  # JSON text, of the body field's schema
    assert extractor["content"]["application/json"]["schema"]["anyOf"][0] == {
        "$ref": "#/components/schemas/ToolResultsExtractor"
    }
    item = components["SubmittedItem"]
    assert item["propertyNames"] == {"pattern": no_nul}  # a key with a NUL is refused
    assert components["JsonValue"]["anyOf"][-2]["additionalProperties"] is False


def test_every_error_response_has_the_error_shape(spec: dict[str, Any]) -> None:
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    for path, _method, operation in _operations(spec):
        for status, response in operation["responses"].items():
            if status.startswith("4"):
                schema = response["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, (path, status)


def test_every_v1_route_needs_the_bearer_key(spec: dict[str, Any]) -> None:
    assert spec["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": spec["components"]["securitySchemes"]["bearer"]["description"],
    }
    for path, method, operation in _operations(spec):
        if path.startswith("/v1/"):
            assert operation.get("security") == [{"bearer": []}], (path, method)
            assert "401" in operation["responses"], (path, method)
            assert "200" in operation["responses"] or method in ("post", "delete"), (path, method)
        else:
            assert "security" not in operation, path
    for path, method in (("/v1/runs/{run_id}/cancel", "post"), ("/v1/runs/{run_id}", "delete")):
        assert "403" in spec["paths"][path][method]["responses"]


def test_the_docs_load_nothing_from_another_site(served: tuple[str, str, Process]) -> None:
    url = served[0]
    page = httpx.get(f"{url}/docs")
    assert page.status_code == 200
    sources = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
    assert sources and all(source.startswith("/docs/static/") for source in sources), sources
    assert "http://" not in page.text.replace("http://www.w3.org", "")
    assert "https://" not in page.text
    for source in sources:
        assert httpx.get(f"{url}{source}").status_code == 200, source
    assert httpx.get(f"{url}/redoc").status_code == 404


def test_405_names_every_method_the_path_has(served: tuple[str, str, Process]) -> None:
    url, key, _ = served
    response = httpx.patch(f"{url}/v1/runs/some-run", headers=bearer(key))
    assert response.status_code == 405
    assert set(response.headers["allow"].split(", ")) >= {"GET", "DELETE"}
    assert response.json()["error"]["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        # the item route reads any id, `/` included, but not a claim's label path
        ("GET", "/v1/runs/{run}/items/q1/claims/0/label", {"PUT", "DELETE"}),
        ("OPTIONS", "/v1/runs/{run}/items/a/b/claims/7/label", {"PUT", "DELETE"}),
        ("PATCH", "/v1/runs/{run}/labels", {"GET", "POST"}),
        ("OPTIONS", "/v1/runs/{run}/labels/sample", {"GET", "POST"}),
        ("PUT", "/v1/runs/{run}/items/q1", {"GET"}),
    ],
)
def test_405_on_the_label_routes_names_their_methods(
    served: tuple[str, str, Process], method: str, path: str, allowed: set[str]
) -> None:
    url, key, _ = served
    run = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
    response = httpx.request(method, url + path.format(run=run), headers=bearer(key))
    assert response.status_code == 405, response.text
    assert set(response.headers["allow"].split(", ")) == allowed


def test_a_run_not_found_is_worded_once_by_every_route(served: tuple[str, str, Process]) -> None:
    url, key, _ = served
    run = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
    as_json = {"headers": {**bearer(key), "Content-Type": "application/json"}}
    label = f"/v1/runs/{run}/items/q1/claims/0/label"
    routes: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", f"/v1/runs/{run}", {}),
        ("GET", f"/v1/runs/{run}/items", {}),
        ("GET", f"/v1/runs/{run}/items/q1", {}),
        ("GET", f"/v1/runs/{run}/results", {}),
        ("POST", f"/v1/runs/{run}/cancel", {}),
        ("POST", f"/v1/runs/{run}/retry", {}),
        ("POST", f"/v1/runs/{run}/resume", {}),
        ("DELETE", f"/v1/runs/{run}", {}),
        ("GET", f"/v1/runs/{run}/labels", {}),
        ("GET", f"/v1/runs/{run}/agreement", {}),
        ("GET", f"/v1/runs/{run}/labels/sample", {}),
        ("POST", f"/v1/runs/{run}/labels/sample", {**as_json, "json": {"size": 1}}),
        ("PUT", label, {**as_json, "json": {"verdict": "no"}}),
        ("DELETE", label, {}),
        ("GET", f"/v1/compare?base={run}&candidate={run}", {}),
    ]
    for method, path, extra in routes:
        headers = extra.pop("headers", bearer(key))
        response = httpx.request(method, url + path, headers=headers, timeout=30, **extra)
        assert response.status_code == 404, (method, path, response.text)
        assert response.json()["error"]["message"] == f"run {run} not found", (method, path)


@pytest.mark.parametrize("path", ["/v1/runs", "/v1/runs/{run}/items"])
def test_an_empty_cursor_is_no_cursor_this_api_returned(
    served: tuple[str, str, Process], path: str
) -> None:
    url, key, _ = served
    run = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
    response = httpx.get(url + path.format(run=run), params={"cursor": ""}, headers=bearer(key))
    assert error_of(response) == (422, "invalid_cursor")


def test_a_labels_file_is_csv_or_ndjson_and_nothing_else(served: tuple[str, str, Process]) -> None:
    url, key, _ = served
    path = f"{url}/v1/runs/1b4e28ba-2fa1-11d2-883f-0016d3cca427/labels"
    for body in (b"[1,2]", b'"str"', b"null"):  # issue 28: each answered "stored 0"
        refused = httpx.post(
            path, content=body, headers={**bearer(key), "Content-Type": "application/json"}
        )
        assert error_of(refused) == (415, "unsupported_media_type"), body
    spec = httpx.get(f"{url}/openapi.json").json()["paths"]["/v1/runs/{run_id}/labels"]["post"]
    assert set(spec["requestBody"]["content"]) == {"text/csv", "application/x-ndjson"}
    assert "415" in spec["responses"]


def test_run_fields_in_the_query_of_a_json_submission_are_refused_not_ignored(
    served: tuple[str, str, Process],
) -> None:
    url, key, _ = served
    body = {"items": [{"ground_truth": "Snow is white.", "context": ["Snow is white."]}]}
    refused = httpx.post(
        f"{url}/v1/runs",
        params={"budget_usd": 1, "name": "a\x00b", "dry_run": "true"},
        json=body,
        headers=bearer(key),
    )
    assert error_of(refused) == (422, "invalid_request")
    assert "(budget_usd, name) are for an NDJSON body" in refused.json()["error"]["message"]
    estimate = httpx.post(
        f"{url}/v1/runs", params={"dry_run": "true"}, json=body, headers=bearer(key)
    )
    assert estimate.status_code == 200, estimate.text


def test_a_resume_body_of_whitespace_json_does_not_have_is_malformed(
    served: tuple[str, str, Process],
) -> None:
    url, key, _ = served
    path = f"{url}/v1/runs/1b4e28ba-2fa1-11d2-883f-0016d3cca427/resume"
    headers = {**bearer(key), "Content-Type": "application/json"}
    assert error_of(httpx.post(path, content=b"\x0c", headers=headers)) == (400, "invalid_json")
    assert error_of(httpx.post(path, content=b" \r\n", headers=headers)) == (404, "not_found")


def test_responses_carry_careful_headers(served: tuple[str, str, Process]) -> None:
    response = httpx.get(f"{served[0]}/healthz")
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["x-frame-options"] == "DENY"


@pytest.mark.slow
def test_schemathesis_with_every_check_finds_nothing(
    served: tuple[str, str, Process], tmp_path: Path
) -> None:
    url, key, process = served
    st = shutil.which("st", path=str(Path(sys.executable).parent)) or "st"
    command = [
        st,
        "--config-file",
        str(CONFIG),
        "run",
        f"{url}/openapi.json",
        "--checks",
        "all",
        "--header",
        f"Authorization: Bearer {key}",
        "--max-examples",
        "40",
        "--max-time",
        str(FUZZ_SECONDS),
        "--seed",
        "11",
        # one thread: CPython 3.11's ast.parse, which Hypothesis calls, can fail spuriously
        # when threads parse at once ("AST constructor recursion depth mismatch", gh-106905)
        "--workers",
        "1",
        "--generation-database",
        "none",
        "--phases",
        "examples,coverage,fuzzing",
        "--no-color",
        "--report",
        "junit",
        "--report-dir",
        str(tmp_path),
        # /readyz answers 503 by design while no worker runs (none does here)
        "--exclude-path",
        "/readyz",
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=FUZZ_SECONDS + 240
    )
    print(done.stdout[-6000:])
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    log = process.output()
    assert "Traceback" not in log and '" 500' not in log
