"""recallq.patches.count_in_files: prometheus-client's multiprocess mode chosen after the
library was imported (recallq's CLI imports it before it knows the command), as `recallq
worker --metrics-port` does before it forks its processes; and the page the processes serve
(recallq.observability.gauges.WorkerProcessesCollector) from their files."""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client.core import Metric

from recallq import patches
from recallq.observability import metrics
from recallq.observability.gauges import WorkerProcessesCollector


def _in_a_forked_process(directory: Path, succeeded: int) -> int:
    """A process that counts in `directory`'s files, as one of a worker's: its pid."""
    pid = os.fork()
    if pid == 0:  # the child: count, and leave without running pytest's exit
        try:
            patches.count_in_files(str(directory))
            # values this test process made before the fork stay in memory: start afresh
            metrics.ITEMS_ENDED.clear()
            metrics.ITEM_TRANSITIONS.clear()
            metrics._last_beats.cache_clear()
            metrics.items_moved("succeeded", succeeded)
            metrics.heartbeat_beat()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    return pid


def _page(directory: Path) -> dict[str, Metric]:
    return {family.name: family for family in WorkerProcessesCollector(str(directory)).collect()}


def test_the_processes_counts_add_up_and_a_dead_ones_stay(tmp_path: Path) -> None:
    first = _in_a_forked_process(tmp_path, 3)
    second = _in_a_forked_process(tmp_path, 4)
    page = _page(tmp_path)
    (ended,) = [s for s in page["recallq_items_ended"].samples if s.name.endswith("_total")]
    assert ended.labels == {"outcome": "succeeded"} and ended.value == 7
    (age,) = page["recallq_worker_heartbeat_age_seconds"].samples
    assert 0 <= age.value < 60
    assert metrics.LAST_BEAT not in page  # its age is on the page, not the beats

    metrics.process_ended(first, str(tmp_path))
    metrics.process_ended(second, str(tmp_path))
    page = _page(tmp_path)
    assert [s.value for s in page["recallq_items_ended"].samples if s.name.endswith("_total")] == [
        7
    ]
    assert "recallq_worker_heartbeat_age_seconds" not in page  # no live process beats
