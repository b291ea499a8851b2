"""A page on another origin cannot create a run on an API with auth off (issue 19, item 7):
Chromium sends a `no-cors` fetch of an untyped Blob (no Content-Type) and of a string
(text/plain), which need no CORS preflight; the API refuses both (415), and no run appears."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from tests.services import Process, start_api

ATTACK = """<!doctype html><title>cat pictures</title><script>
const body = JSON.stringify(%(body)s);
(async () => {
  const sent = [];
  for (const payload of [new Blob([body]), body]) {
    try { await fetch("%(api)s/v1/runs", {method: "POST", mode: "no-cors", body: payload});
          sent.push("sent"); }
    catch (e) { sent.push("error " + e); }
  }
  window.attack = sent;
})();
</script>"""


@pytest.fixture()
def auth_off_api(service_env: dict[str, str]) -> Iterator[tuple[str, Process]]:
    process, url = start_api(service_env)
    yield url, process
    process.stop()


@pytest.fixture()
def attacker(auth_off_api: tuple[str, Process]) -> Iterator[str]:
    """The attacker's site: another origin (another port) serving the page above."""
    body = {
        "name": "from-another-site",
        "items": [{"id": "x", "ground_truth": "g", "context": ["c"]}],
    }
    page = ATTACK % {"body": json.dumps(body), "api": auth_off_api[0]}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(page.encode())

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_a_page_on_another_origin_cannot_create_a_run(
    context: Any, auth_off_api: tuple[str, Process], attacker: str
) -> None:
    url, process = auth_off_api
    page = context.new_page()
    page.goto(attacker)
    page.wait_for_function("window.attack && window.attack.length === 2")
    # no-cors answers are opaque: the page learns nothing, and the fetches did go out
    assert page.evaluate("window.attack") == ["sent", "sent"]
    runs = httpx.get(f"{url}/v1/runs", params={"name": "from-another-site"}).json()["runs"]
    assert runs == []
    refused = [line for line in process.output().splitlines() if "POST /v1/runs" in line]
    assert len(refused) == 2 and all('" 415' in line for line in refused), refused
