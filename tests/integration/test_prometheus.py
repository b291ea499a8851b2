"""The metrics as an operator's Prometheus sees them: Debian's `prometheus` scraping a real API
and two real worker commands every second (one of two processes, one of one: a command's
processes add up on its one port), while a 300-item run meets injected 429s and a
short outage of the stub provider (over HTTP, through litellm). Its HTTP API is asked what
the service did, and the answers are checked against the run and the stub's own records."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.integration.faults import calls_for_tag, make_items, progress, submit, wait_until
from tests.services import (
    REPO,
    Process,
    free_port,
    migrated_database,
    start_api,
    wait_for_run,
)

# Debian's prometheus is at /usr/bin/prometheus (.ci/run installs it when it is missing)
pytestmark = pytest.mark.slow

TOKEN = "metrics-token-7f3a"
OUTAGE_S = 8.0
STAGE_OF = {
    "claim_extraction": "extraction",
    "claim_extraction_packed": "extraction",
    "claim_attribution": "attribution",
}
# every label a recallq series may carry (Prometheus adds job and instance; `le` is a bucket's)
LABELS = {"__name__", "job", "instance", "model", "stage", "outcome", "kind", "status"}
LABELS |= {"route", "method", "le", "mode"}  # mode: a precision mode (cited|judged)


@pytest.fixture(scope="module")
def pg_database() -> Iterator[str]:
    """This module's own database: its workers score only its run."""
    with migrated_database() as url:
        yield url


@pytest.fixture(scope="module")
def env(service_env: dict[str, str]) -> dict[str, str]:
    return {
        **service_env,
        "RECALLQ_METRICS_TOKEN": TOKEN,
        "RECALLQ_MAX_ATTEMPTS": "5",
        "RECALLQ_RETRY_MAX_DELAY": "1",
        "RECALLQ_REQUEST_TIMEOUT": "10",
        "RECALLQ_REAPER_INTERVAL": "1",
        "RECALLQ_HEARTBEAT_TTL": "3",
        "RECALLQ_BREAKER_COOL_DOWN": "1",
        "RECALLQ_BREAKER_MAX_COOL_DOWN": "2",
    }


class Prometheus:
    """Debian's prometheus on a free port, its data in a temporary directory."""

    def __init__(self, directory: Path, api_port: int, worker_ports: list[int]) -> None:
        workers = ", ".join(f"'127.0.0.1:{port}'" for port in worker_ports)
        config = directory / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: api\n"
            f"    authorization: {{credentials: {TOKEN}}}\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{api_port}']}}]\n"
            "  - job_name: workers\n"
            f"    static_configs: [{{targets: [{workers}]}}]\n"
        )
        self.url = f"http://127.0.0.1:{free_port()}"
        self._log = (directory / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                "/usr/bin/prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address={self.url.removeprefix('http://')}",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        wait_until(self._ready, timeout=60, interval=0.5)

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def api(self, path: str, **params: Any) -> Any:
        response = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        response.raise_for_status()
        body = response.json()
        assert body["status"] == "success", body
        return body["data"]

    def values(self, query: str) -> dict[tuple[tuple[str, str], ...], float]:
        """An instant query's samples, by their labels."""
        result = self.api("query", query=query)["result"]
        return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in result}

    def scalar(self, query: str) -> float | None:
        found = list(self.values(query).values())
        return found[0] if found else None

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self._log.close()


@pytest.fixture(scope="module")
def service(env: dict[str, str], tmp_path_factory) -> Iterator[dict[str, Any]]:
    api_process, api_url = start_api(env)
    ports = [free_port(), free_port()]
    workers = []
    for port, processes in zip(ports, (2, 1), strict=True):
        args = ["worker", "--processes", str(processes), "--concurrency", "8"]
        args += ["--metrics-port", str(port)]
        worker = Process(args, env, "worker")
        worker.wait_for_output(" ready.", timeout=90)
        workers.append(worker)
    api_port = int(api_url.rsplit(":", 1)[1])
    prometheus = Prometheus(tmp_path_factory.mktemp("prometheus"), api_port, ports)
    try:
        yield {"api": api_url, "prometheus": prometheus, "worker_ports": ports}
    finally:
        prometheus.stop()
        for worker in workers:
            worker.stop()
        api_process.stop()


def _targets_up(prometheus: Prometheus) -> bool:
    targets = prometheus.api("targets")["activeTargets"]
    return len(targets) == 3 and all(t["health"] == "up" for t in targets)


def test_prometheus_sees_the_run_the_incident_and_the_spend(service, clean_stub) -> None:
    api, prometheus = service["api"], service["prometheus"]
    wait_until(lambda: _targets_up(prometheus), timeout=30, interval=0.5)
    clean_stub.configure(rate_429=0.05, retry_after_s="1", seed=22, latency_ms=30)

    run_id = submit(api, make_items("pm", 300))
    wait_until(lambda: progress(api, run_id) >= 60, timeout=120)
    outage_started = time.time()
    clean_stub.outage(OUTAGE_S)
    wait_until(lambda: time.time() > outage_started + OUTAGE_S, timeout=60)
    run = wait_for_run(api, run_id, timeout=300)
    assert run["status"] == "completed" and run["counts"]["succeeded"] == 300
    ended = time.time()

    # the workers' counters after their last scrape: the items each ended add up to the run
    succeeded = 'sum(recallq_items_ended_total{job="workers",outcome="succeeded"})'
    wait_until(lambda: prometheus.scalar(succeeded) == 300, timeout=30, interval=0.5)
    assert prometheus.scalar('sum(recallq_items_ended_total{outcome="failed"})') in (None, 0.0)
    time.sleep(2.5)  # a scrape of every target after the stub's last call

    calls = calls_for_tag(clean_stub, "pm")
    by_stage: dict[str, int] = {}
    for call in calls:
        by_stage[STAGE_OF[call["schema"]]] = by_stage.get(STAGE_OF[call["schema"]], 0) + 1
    seen = prometheus.values('sum by (stage) (recallq_judge_calls_total{job="workers"})')
    assert {dict(labels)["stage"]: value for labels, value in seen.items()} == by_stage
    outcomes = prometheus.values('sum by (outcome) (recallq_judge_calls_total{job="workers"})')
    outcome = {dict(labels)["outcome"]: value for labels, value in outcomes.items()}
    statuses = [c["status"] for c in calls]
    assert outcome["answered"] + outcome.get("repaired", 0) == statuses.count(200)
    assert outcome["transient_error"] == statuses.count(429) + statuses.count(503)
    assert statuses.count(503) > 0 and statuses.count(429) > 0  # the incident did happen
    assert prometheus.scalar("sum(recallq_provider_rate_limited_total)") == statuses.count(429)
    assert prometheus.scalar("sum(recallq_judge_call_seconds_count)") == len(calls)

    tokens = prometheus.values("sum by (kind) (recallq_judge_tokens_total)")
    kinds = {dict(labels)["kind"]: value for labels, value in tokens.items()}
    assert kinds == {
        "prompt": run["usage"]["prompt_tokens"],
        "completion": run["usage"]["completion_tokens"],
    }
    cost = prometheus.scalar("sum(recallq_judge_cost_usd_total)") or 0.0
    assert cost == pytest.approx(run["usage"]["cost_usd"], abs=1e-6)

    # the breaker was open during the outage, as the API and both workers saw it
    span = {"start": outage_started, "end": ended, "step": "1s"}
    opened = prometheus.api(
        "query_range", query='max by (job) (recallq_breaker_open{model="stub-judge"})', **span
    )["result"]
    assert {r["metric"]["job"] for r in opened} == {"api", "workers"}
    for series in opened:
        assert max(float(v) for _, v in series["values"]) == 1.0, series
    openings = prometheus.scalar("sum(recallq_breaker_openings_total)") or 0.0
    assert openings >= 1
    closed = 'max(recallq_breaker_open{model="stub-judge"})'
    wait_until(lambda: prometheus.scalar(closed) == 0.0, timeout=30, interval=0.5)

    # work waited while the run went, and none waits after it
    waiting = prometheus.api(
        "query_range", query='recallq_items_waiting{model="stub-judge"}', **span
    )["result"]
    assert max(float(v) for _, v in waiting[0]["values"]) > 0
    wait_until(
        lambda: prometheus.scalar('recallq_items_waiting{model="stub-judge"}') == 0.0,
        timeout=30,
        interval=0.5,
    )
    assert prometheus.scalar('recallq_runs_active{model="stub-judge"}') == 0.0
    assert prometheus.scalar("recallq_workers_live") == 3.0  # processes: 2 + 1
    ages = prometheus.values("recallq_worker_heartbeat_age_seconds")  # one per command
    assert len(ages) == 2 and all(0 <= age < 3 for age in ages.values())

    # the API's requests by route template: the status polls of this run, never its id
    polls = 'sum(recallq_http_request_seconds_count{route="/v1/runs/{run_id}",status="200"})'
    assert (prometheus.scalar(polls) or 0) > 0


def test_no_series_carries_an_id(service, clean_stub) -> None:
    api, prometheus = service["api"], service["prometheus"]
    run_id = submit(api, make_items("card", 5))
    wait_for_run(api, run_id, timeout=120)
    httpx.get(f"{api}/v1/runs/{run_id}/items/card-1", timeout=10)
    httpx.get(f"{api}/v1/runs/no-such-run", timeout=10)
    time.sleep(2.5)
    series = prometheus.api("series", **{"match[]": '{__name__=~"recallq_.*"}'})
    assert len(series) > 20
    names = {s["__name__"] for s in series}
    for expected in ("recallq_items_ended_total", "recallq_judge_calls_total"):
        assert expected in names
    an_id = re.compile(r"[0-9a-f]{8}-|[0-9a-f]{16,}|\bcard-|no-such-run")
    for one in series:
        assert set(one) <= LABELS, one
        for label, value in one.items():
            if label not in ("instance", "le"):
                assert not an_id.search(value), one
                assert run_id not in value, one
    assert len(series) < 400  # bounded: a handful of models, stages, outcomes and routes


def test_the_compose_worker_healthcheck_reads_a_live_worker(service) -> None:
    """docker-compose.yml's worker healthcheck, run as written against a real worker."""
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    command = compose["services"]["worker"]["healthcheck"]["test"]
    assert command[:3] == ["CMD", "python", "-c"]
    worker_port = service["worker_ports"][0]
    code = command[3].replace("127.0.0.1:9100", f"127.0.0.1:{worker_port}")
    assert subprocess.run([sys.executable, "-c", code], timeout=30).returncode == 0
    nobody = code.replace(f":{worker_port}/", f":{free_port()}/")
    assert subprocess.run([sys.executable, "-c", nobody], capture_output=True).returncode != 0
