"""Prometheus metrics of this process (prometheus-client's default registry).

    events   the store, the judge, the rate limiter, the breaker and the batch lane call the
             hook functions below at one place each: counters and histograms of this process
    state    read when Prometheus scrapes (recallq.observability.gauges): the breaker of every
             model, and on the API the work waiting across active runs and the pending batches

Labels are of low cardinality only: a model named in the models file, a stage, an outcome, a
precision mode, a status, a route template. Never a run, an item, a key or a project: every
process's series stay a fixed, small set however many runs it scores. Each API process serves
its own registry; the processes of one `recallq worker` command write theirs to files in one
directory (prometheus-client's multiprocess mode, recallq.patches) and any of them serves their
sum on the command's one port (`listen`, `serve_processes`). The `instance` label Prometheus adds
tells commands apart. docs/operations.md lists every metric.
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
import time
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import prometheus_client
from prometheus_client import Counter, Gauge, Histogram, multiprocess
from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry

from recallq.core.exits import CommandError
from recallq.core.status import ITEM_ENDED

log = logging.getLogger(__name__)

# a `_created` series beside every counter doubles what a scrape carries, for nothing we use
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

# judge calls take from ~50 ms (a small local model) to minutes (a long attribution)
_CALL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

ITEMS_ENDED = Counter(
    "recallq_items_ended", "Items that ended, by outcome (succeeded|failed|cancelled)", ["outcome"]
)
ITEM_TRANSITIONS = Counter(
    "recallq_item_transitions", "Item state moves made by this process, by new status", ["status"]
)
JUDGE_CALLS = Counter(
    "recallq_judge_calls",
    "Requests sent to a judge model, by outcome (answered|repaired|transient_error|"
    "permanent_error; repaired: the answered repair request of a malformed answer)",
    ["model", "stage", "outcome"],
)
JUDGE_CALL_SECONDS = Histogram(
    "recallq_judge_call_seconds",
    "Time of one request to a judge model, whatever its outcome",
    ["model", "stage"],
    buckets=_CALL_BUCKETS,
)
JUDGE_TOKENS = Counter(
    "recallq_judge_tokens",
    "Tokens of answered judge calls, by kind (prompt|completion)",
    ["model", "stage", "kind"],
)
JUDGE_COST = Counter(
    "recallq_judge_cost_usd", "Cost of answered judge calls in USD", ["model", "stage"]
)
PROVIDER_RATE_LIMITED = Counter(
    "recallq_provider_rate_limited", "Judge calls the provider refused with a 429", ["model"]
)
RATE_LIMIT_WAIT = Counter(
    "recallq_rate_limit_wait_seconds",
    "Time judge calls spent waiting for rate-limit capacity",
    ["model"],
)
RATE_LIMIT_DEFERRED = Counter(
    "recallq_rate_limit_deferred",
    "Judge calls put off because no rate-limit capacity came within the longest wait",
    ["model"],
)
BREAKER_OPENINGS = Counter(
    "recallq_breaker_openings", "Times this process's report opened a model's breaker", ["model"]
)
BATCHES_APPLIED = Counter(
    "recallq_batch_batches_applied", "Provider batches whose results were applied", ["model"]
)
PRECISION_ITEMS = Counter(
    "recallq_precision_items",
    "Items scored with a context precision, by precision mode (cited|judged)",
    ["mode"],
)
HTTP_REQUEST_SECONDS = Histogram(
    "recallq_http_request_seconds",
    "API requests by method, route template and status code, until the response ended",
    ["method", "route", "status"],
)

# --- hooks: each called at one place ------------------------------------------------------


def items_moved(status: str, count: int) -> None:
    """The stores (recallq.state): `count` items moved into `status` (the write was made)."""
    ITEM_TRANSITIONS.labels(str(status)).inc(count)
    if status in ITEM_ENDED:
        ITEMS_ENDED.labels(str(status)).inc(count)


def precision_scored(mode: str) -> None:
    """The stores: an item ended with a context precision of this mode."""
    PRECISION_ITEMS.labels(str(mode)).inc()


def judge_call(model: str, stage: str, outcome: str, seconds: float) -> None:
    """recallq.judge.llm: one request went to the model."""
    JUDGE_CALLS.labels(model, stage, outcome).inc()
    JUDGE_CALL_SECONDS.labels(model, stage).observe(seconds)


def judge_usage(model: str, stage: str, prompt: int, completion: int, cost_usd: float) -> None:
    """recallq.judge.llm: what an answered call used (what the run's usage counts)."""
    JUDGE_TOKENS.labels(model, stage, "prompt").inc(prompt)
    JUDGE_TOKENS.labels(model, stage, "completion").inc(completion)
    JUDGE_COST.labels(model, stage).inc(cost_usd)


def provider_rate_limited(model: str) -> None:
    PROVIDER_RATE_LIMITED.labels(model).inc()


def rate_limit_waited(model: str, seconds: float) -> None:
    RATE_LIMIT_WAIT.labels(model).inc(seconds)


def rate_limit_deferred(model: str) -> None:
    RATE_LIMIT_DEFERRED.labels(model).inc()


def breaker_recorded(model: str, what: str) -> None:
    """recallq.coordination.breaker: what breaker.lua said a report did."""
    if what in ("opened", "reopened"):
        BREAKER_OPENINGS.labels(model).inc()


def batch_applied(model: str) -> None:
    BATCHES_APPLIED.labels(model).inc()


#: when each worker process's heartbeat last reached Redis: read by the worker's page
#: (recallq.metrics_state.WorkerProcessesCollector), which serves the age of the stalest
LAST_BEAT = "recallq_worker_last_beat_seconds"


@functools.cache
def _last_beats() -> Gauge:
    # made in the process that beats: one made where the command starts, before it forks,
    # would count as a live process that never beat; on no registry: the page shows its age
    return Gauge(
        LAST_BEAT,
        "When this process's heartbeat last reached Redis",
        registry=None,
        multiprocess_mode="livemin",
    )


def heartbeat_beat() -> None:
    """recallq.coordination.liveness: this worker's heartbeat reached Redis."""
    _last_beats().set(time.time())


# --- serving ------------------------------------------------------------------------------


_state_collectors: list[Collector] = []
_state_lock = threading.Lock()


def use_state_collectors(*collectors: Collector) -> None:
    """The collectors of state this process reports, in place of any it had (a process
    builds its runtime once; a test process builds several apps, the last one reports)."""
    with _state_lock:
        for old in _state_collectors:
            REGISTRY.unregister(old)
        _state_collectors[:] = collectors
        for collector in collectors:
            REGISTRY.register(collector)


def exposition() -> tuple[bytes, str]:
    """This process's metrics in Prometheus's text format, and its content type."""
    return prometheus_client.generate_latest(REGISTRY), prometheus_client.CONTENT_TYPE_LATEST


def listen(host: str, port: int) -> socket.socket:
    """The socket a worker command's metrics are served on, opened where the command starts:
    every process of it serves the same page from it, a process replaced leaves no gap, and a
    port in use is one line before anything starts."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        listening = socket.socket(family, kind, proto)
    except (OSError, OverflowError) as exc:  # not an address here, port out of range
        raise _cannot_serve(host, port, exc) from None
    try:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind(address)
        listening.listen(64)
    except OSError as exc:  # in use
        listening.close()
        raise _cannot_serve(host, port, exc) from None
    # every process waits for connections on it: those a sibling took first must not block
    listening.setblocking(False)
    return listening


def _cannot_serve(host: str, port: int, exc: Exception) -> CommandError:
    reason = getattr(exc, "strerror", None) or str(exc)
    return CommandError(f"--metrics-port: cannot serve metrics on {host}:{port}: {reason}")


def serve_processes(listening: socket.socket, *collectors: Collector) -> None:
    """What `collectors` collect (the processes' files and the state gauges), served from a
    thread of this process on the socket of `listen`."""
    registry = CollectorRegistry()
    for collector in collectors:
        registry.register(collector)
    server = _Server(listening)
    server.set_app(prometheus_client.make_wsgi_app(registry))
    threading.Thread(target=server.serve_forever, name="recallq-metrics", daemon=True).start()


def process_ended(pid: int, directory: str) -> None:
    """A worker process ended: its live gauges leave the page (its counters stay counted)."""
    multiprocess.mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]


class _Quiet(WSGIRequestHandler):
    timeout = 10  # a client that sends nothing holds one thread for this long at most

    def log_message(self, format: str, *args: Any) -> None:  # a scrape is not news
        pass


class _Server(ThreadingMixIn, WSGIServer):
    """A WSGI server on a socket bound and listening already (shared by several processes)."""

    daemon_threads = True

    def __init__(self, listening: socket.socket) -> None:
        host, port = listening.getsockname()[:2]
        super().__init__((host, port), _Quiet, bind_and_activate=False)
        self.socket.close()
        self.socket = listening
        self.server_name, self.server_port = host, port
        self.setup_environ()
