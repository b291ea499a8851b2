"""Faults between hosts (issue 30): workers on hosts of their own, Postgres, Redis and the API on
another, the stub judge on a third (tests/multihost/hosts.py draws them). A run of a few
hundred items must finish with nothing lost, no claim stored twice and usage equal to the
stub's count when a worker host is cut off from Redis and Postgres for a minute, when the
workers' link to Postgres is slow, and when a worker host vanishes.

The workers are shared by the tests (each start costs seconds of CPU): a test takes the live
ones, healed and without delay, and starts what is missing.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from tests.integration.faults import item_rows, make_items, settled
from tests.multihost import hosts
from tests.multihost.cluster import Cluster, Worker, timed

pytestmark = pytest.mark.slow

ITEMS = 300  # a run of a few hundred items, as the issue asks
THREADS = 16  # per worker: two workers keep 32 calls or statements in flight
JUDGE_LATENCY_MS = 100  # each judge call takes this long: a fault always finds calls in flight
PARTITION_S = 60.0  # the minute, kept whatever else is shortened
LEASE_S = 30.0  # stage and queue leases: shorter than the partition, so the takeover must
# come within one; still far longer than any stage here, even over the slow link
HEARTBEAT_TTL_S = 4.0  # a silent worker is dead after this: it beats every TTL/4
REAPER_INTERVAL_S = 1.0  # a sweep a second: lost work back within the TTL plus a second
IDLE_TRANSACTION_S = 15.0  # Postgres ends a gone worker's open transaction after this, freeing
# its rows for the takeover: within the lease, and the vanishing bound, with room
# 8x the threads (a thread attributes an attribution message's 4 items in a row, and as many
# again wait in the queue): a queued item waits seconds, not a lease, even when slow
DISPATCH_WINDOW = 256
POSTGRES_DELAY_MS = 200.0  # the slow link, on every frame from a worker to Postgres
SLOW_ITEMS = 200  # the slow link's run: each item costs seconds of round trips
IDLE_SAMPLE_S = 4.0  # how long the idle workers' statements are counted before the slow run
SLOW_SHARE = 1 / 3  # of the throughput the round trips allow, the least the slow run reaches:
# an extraction group takes its 8 items one after the other on one thread, so with a window of
# 2x the threads about half the threads are busy (51% measured); a third still catches a
# collapse (items taken twice, a requeue storm: 2x the work or more)
VANISH_WITHIN_S = 60.0  # the bound from a host vanishing to the run's end
HEAL_WITHIN_S = 150.0  # after healing, a stalled connection speaks at its next retransmission:
# TCP's backoff doubles up to 120 s, so the first one after a minute comes within ~50 s

REFUSED = re.compile(r"item (\d+): (\w+) refused: no longer owned by (\S+)")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    reason = hosts.unavailable()
    if reason is not None:
        pytest.skip(f"multi-host tests need network namespaces: {reason}")
    settings = {
        "RECALLQ_LEASE_SECONDS": str(LEASE_S),
        "RECALLQ_QUEUE_LEASE_SECONDS": str(LEASE_S),
        "RECALLQ_HEARTBEAT_TTL": str(HEARTBEAT_TTL_S),
        "RECALLQ_REAPER_INTERVAL": str(REAPER_INTERVAL_S),
        "RECALLQ_DISPATCH_WINDOW": str(DISPATCH_WINDOW),
        "RECALLQ_WORKER_IDLE_TRANSACTION_TIMEOUT": str(IDLE_TRANSACTION_S),
    }
    with hosts.scratch_directory() as scratch, hosts.Network(scratch) as network:
        started = Cluster(network, scratch, settings)
        try:
            yield started
        finally:
            started.close()


def _fresh_stub(cluster: Cluster) -> None:
    cluster.stub.reset()
    cluster.stub.configure(latency_ms=JUDGE_LATENCY_MS, record_messages=False)


def _scored_once(cluster: Cluster, run: dict[str, Any]) -> list[dict[str, Any]]:
    """Every item scored, each with one set of claims; the items' usage adds up to the run's."""
    rows = item_rows(cluster.database_url, run["id"])
    assert run["status"] == "completed", run
    assert [r["status"] for r in rows] == ["succeeded"] * len(rows), [
        (r["key"], r["status"], r["error"]) for r in rows if r["status"] != "succeeded"
    ]
    for row in rows:
        assert row["claim_indices"] == list(range(row["claims_total"])), row
        assert row["score"] == 1.0, row
    assert sum(r["llm_calls"] for r in rows) == run["usage"]["llm_calls"]
    return rows


def _seconds(run: dict[str, Any]) -> float:
    started, finished = (datetime.fromisoformat(run[k]) for k in ("started_at", "finished_at"))
    return (finished - started).total_seconds()


def _say(text: str) -> None:
    print(f"\nmultihost: {text}", flush=True)


def test_a_slow_link_to_postgres(cluster: Cluster) -> None:
    """200 ms on every frame from the workers to Postgres: the run goes as fast as its round
    trips allow, and the reaper does not take slow for dead (no item is taken twice)."""
    workers = cluster.workers(2, THREADS)
    _fresh_stub(cluster)
    logged = {w.worker_id: len(w.process.output()) for w in workers}
    for worker in workers:
        worker.host.delay_postgres(POSTGRES_DELAY_MS)
    try:
        # Heartbeat and reaper statements come from threads of their own, not the task
        # threads the bound below counts: what an idle worker sends is taken off the run's.
        sent_before = sum(w.host.queries_sent() for w in workers)
        time.sleep(IDLE_SAMPLE_S)
        sent_idle = sum(w.host.queries_sent() for w in workers) - sent_before
        sent_before += sent_idle
        submitted = time.monotonic()
        with cluster.watching(workers) as looked_dead:
            run_id = cluster.submit(make_items("sl", SLOW_ITEMS))
            run = cluster.wait_for_run(run_id, timeout=300)
        background = sent_idle / IDLE_SAMPLE_S * (time.monotonic() - submitted)
        queries = sum(w.host.queries_sent() for w in workers) - sent_before - background
    finally:
        for worker in workers:
            worker.host.delay_postgres(0)
    _say(f"slow link: seconds each worker looked dead: {looked_dead}")
    assert not any(looked_dead.values()), f"a live worker looked dead: {looked_dead}"
    rows = _scored_once(cluster, run)
    answered = [c for c in cluster.calls_for("sl") if c["status"] == 200]
    assert run["usage"]["llm_calls"] == len(answered)
    taken_again = cluster.query(
        "SELECT id, attempts FROM items WHERE run_id = :run AND attempts <> 1", run=run_id
    )
    assert taken_again == [], "the reaper took slow items for lost"
    for worker in workers:
        logs = worker.process.output()[logged[worker.worker_id] :]
        assert "requeueing" not in logs
        assert "broker lost its data" not in logs  # Redis never restarted
    # Each round trip holds a worker thread for the delay at least, each call for the judge's
    # latency: the run cannot go faster than the threads allow for all of them.
    busy = queries * POSTGRES_DELAY_MS / 1000 + len(answered) * JUDGE_LATENCY_MS / 1000
    allowed = len(rows) * len(workers) * THREADS / busy
    measured = len(rows) / _seconds(run)
    _say(
        f"slow link: {len(rows)} items in {_seconds(run):.1f} s, {queries:.0f} statements "
        f"({queries / len(rows):.1f} per item; {sent_idle / IDLE_SAMPLE_S:.1f}/s when idle), "
        f"{len(answered)} calls: {measured:.2f} items/s "
        f"of {allowed:.2f} allowed ({measured / allowed:.0%})"
    )
    assert measured <= allowed * 1.05, "faster than the delay allows: was it applied?"
    assert measured >= SLOW_SHARE * allowed


def test_a_worker_host_cut_off_for_a_minute(cluster: Cluster) -> None:
    """A worker host loses Redis and Postgres for a minute with its calls in flight (its judge
    still answers): another worker takes its items over within the lease, the run completes,
    and what the stale worker writes once healed is refused by the store's guards."""
    cut, other = cluster.workers(2, THREADS)
    _fresh_stub(cluster)
    run_id = cluster.submit(make_items("pt", ITEMS))
    hosts.wait_until(lambda: cluster.progress(run_id) >= ITEMS // 4, timeout=120)
    cut_log = len(cut.process.output())
    cut.host.cut()
    cut_at, cut_clock = time.monotonic(), time.time()
    held = cluster.owned_by(run_id, cut)
    assert held, "the cut worker held no item: nothing to take over"
    try:
        taken_over = timed(lambda: not held & cluster.owned_by(run_id, cut), LEASE_S, 0.25)
    except TimeoutError:
        still = held & cluster.owned_by(run_id, cut)
        raise AssertionError(f"not taken over within the lease ({LEASE_S} s): {still}") from None
    time.sleep(max(0.0, cut_at + PARTITION_S - time.monotonic()))
    ended_cut_off = cluster.run(run_id)["status"] == "completed"
    logged = len(cut.process.output())
    cut.host.heal()
    back = timed(lambda: cluster.alive(cut), HEAL_WITHIN_S)
    refusals = _refusals(cut, logged)
    refused_after = timed(lambda: refusals() or None, HEAL_WITHIN_S - back, 0.25) + back
    cluster.wait_for_run(run_id, timeout=60)
    # a stale worker's refused writes still count their calls, and can land after the run ended
    run = settled(
        lambda: cluster.run(run_id),
        lambda: sum(c["status"] == 200 for c in cluster.calls_for("pt")),
        # no "quiet" end: a stalled connection speaks again at its next retransmission
        quiet_s=HEAL_WITHIN_S,
        within_s=HEAL_WITHIN_S,
    )
    rows = _scored_once(cluster, run)
    item, move, owner = refusals()[0]
    final = {r["id"]: r for r in item_rows(cluster.database_url, run_id)}[item]
    _say(
        f"cut off: {len(held)} items of {cut.worker_id} taken over in {taken_over:.1f} s; run "
        f"{'completed while it was cut off' if ended_cut_off else 'completed after healing'}; "
        f"back {back:.1f} s after healing; first refused write {refused_after:.1f} s after "
        f"healing: item {item} ({final['key']}, {final['status']}) {move}, no longer {owner}'s"
    )
    answered = [c for c in cluster.calls_for("pt") if c["status"] == 200]
    to_cut = [c for c in answered if c["client"] == cut.host.judge_address]
    while_cut = [c for c in to_cut if c["t"] + JUDGE_LATENCY_MS / 1000 >= cut_clock]
    since_cut = cut.process.output()[cut_log:]
    assert run["usage"]["llm_calls"] == len(answered), (
        f"usage counts {run['usage']['llm_calls']} calls, the stub answered {len(answered)}: "
        f"{len(while_cut)} answered to {cut.worker_id} from the cut on; since the cut it had "
        f"{len(refusals())} writes refused after healing and gave "
        f"{since_cut.count('service unavailable')} tasks back on an outage"
    )
    assert sum(r["llm_calls"] for r in rows) == len(answered)
    del other


def _refusals(worker: Worker, after: int) -> Any:
    """A reader of the writes the store refused to `worker` since offset `after` of its log."""

    def found() -> list[tuple[int, str, str]]:
        text = worker.process.output()[after:]
        return [(int(i), move, owner) for i, move, owner in REFUSED.findall(text)]

    return found


def test_a_worker_host_vanishes(cluster: Cluster) -> None:
    """A worker host vanishes mid-run (links down, processes SIGKILLed, namespace deleted, its
    connections left open at the far end): the run completes within a minute. Calls the stub
    answered to the host after it went cannot be counted by anyone; every other call is."""
    workers = cluster.workers(2, THREADS)
    _fresh_stub(cluster)
    run_id = cluster.submit(make_items("vh", ITEMS))
    hosts.wait_until(lambda: cluster.progress(run_id) >= ITEMS // 4, timeout=120)
    # the busier: a worker back from a partition may not have taken work again yet
    gone = max(workers, key=lambda w: len(cluster.owned_by(run_id, w)))
    held = cluster.owned_by(run_id, gone)
    assert held, "the worker to vanish held no item: nothing to recover"
    address = gone.host.judge_address
    gone_clock = time.time()
    cut_at = gone.host.vanish()  # from then on nothing of its reached the database
    gone_at = time.monotonic()
    try:
        run = cluster.wait_for_run(run_id, timeout=VANISH_WITHIN_S)
    except TimeoutError:
        stuck = cluster.query(
            "SELECT id, status, owner, lease_until, attempts FROM items WHERE run_id = :run "
            "AND status NOT IN ('succeeded', 'failed')",
            run=run_id,
        )
        raise AssertionError(f"not recovered within {VANISH_WITHIN_S} s: {stuck}") from None
    recovered = time.monotonic() - gone_at
    rows = _scored_once(cluster, run)
    answered = [c for c in cluster.calls_for("vh") if c["status"] == 200]
    to_gone = [c for c in answered if c["client"] == address]

    def answered_after(moment: float) -> int:
        return sum(1 for c in to_gone if c["t"] + JUDGE_LATENCY_MS / 1000 >= moment)

    # answered after its database link was cut: never counted (a call answered between the
    # clock above and the cut may be). Answered in its last second: received, maybe not yet
    # stored when it went.
    lost = len(answered) - run["usage"]["llm_calls"]
    _say(
        f"vanished: {len(held)} items of {gone.worker_id} in flight; run completed "
        f"{recovered:.1f} s after; usage {run['usage']['llm_calls']} of {len(answered)} calls "
        f"answered ({answered_after(gone_clock)} answered to the host after it went)"
    )
    assert answered_after(cut_at) <= lost <= answered_after(gone_clock - 1.0)
    assert len(rows) == ITEMS
