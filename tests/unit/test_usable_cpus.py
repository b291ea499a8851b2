"""How many processes `recallq worker` starts by default: the CPUs it may use, which in a
container is its cgroup's quota, not the node's count (os.cpu_count())."""

from __future__ import annotations

import os
from pathlib import Path

from worker.supervisor import cgroup_cpu_quota, usable_cpus


def _tree(tmp_path: Path, membership: str, limits: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for directory, cpu_max in limits.items():
        (root / directory).mkdir(parents=True, exist_ok=True)
        (root / directory / "cpu.max").write_text(cpu_max + "\n")
    (root / membership.strip("/")).mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "cgroup-of-self"
    proc.write_text(f"0::{membership}\n")
    return root, proc


def test_the_quota_of_the_cgroup_or_a_parent_the_smallest(tmp_path: Path) -> None:
    root, proc = _tree(
        tmp_path,
        "/kubepods/pod1/ctr",
        {
            "kubepods": "max 100000",
            "kubepods/pod1": "150000 100000",
            "kubepods/pod1/ctr": "max 100000",
        },
    )
    assert cgroup_cpu_quota(root, proc) == 1.5
    root, proc = _tree(tmp_path / "b", "/", {".": "200000 100000"})  # a cgroup namespace
    assert cgroup_cpu_quota(root, proc) == 2.0


def test_no_quota_without_a_limit_or_without_cgroup_v2(tmp_path: Path) -> None:
    root, proc = _tree(tmp_path, "/user.slice", {"user.slice": "max 100000"})
    assert cgroup_cpu_quota(root, proc) is None
    proc.write_text("12:cpu,cpuacct:/docker/abc\n")  # cgroup v1 only
    assert cgroup_cpu_quota(root, proc) is None
    assert cgroup_cpu_quota(root, tmp_path / "missing") is None


def test_usable_cpus_is_within_this_process_affinity() -> None:
    assert 1 <= usable_cpus() <= len(os.sched_getaffinity(0))
