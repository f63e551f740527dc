"""The compute-thread policy (engine/host/threads.py): usable cores, one OpenMP team."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from engine.host import threads


def _cgroup_v2(root, relative: str, cpu_max: str) -> None:
    folder = root / relative.lstrip("/")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cpu.max").write_text(cpu_max + "\n")


def test_a_cgroup_v2_quota_caps_the_cores(tmp_path, monkeypatch):
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda _: set(range(64)))
    _cgroup_v2(tmp_path, "/", "max 100000")
    _cgroup_v2(tmp_path, "/job", "150000 100000")  # 1.5 CPUs: two threads, one part-time
    assert threads.usable_cores(tmp_path, "0::/job\n") == 2
    assert threads.usable_cores(tmp_path, "0::/\n") == 64


def test_a_quota_above_the_process_applies_and_none_means_the_affinity(tmp_path, monkeypatch):
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda _: {0, 1, 2, 3})
    _cgroup_v2(tmp_path, "/", "max 100000")
    _cgroup_v2(tmp_path, "/parent", "300000 100000")
    _cgroup_v2(tmp_path, "/parent/child", "max 100000")
    assert threads._cgroup_cpu_limit(tmp_path, "0::/parent/child\n") == 3.0
    assert threads._cgroup_cpu_limit(tmp_path, "0::/\n") is None
    assert threads._cgroup_cpu_limit(tmp_path, "") is None


def test_a_cgroup_v1_cfs_quota_counts(tmp_path):
    cpu = tmp_path / "cpu" / "svc"
    cpu.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text("200000\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    proc = "4:memory:/svc\n2:cpu,cpuacct:/svc\n0::/\n"
    assert threads._cgroup_cpu_limit(tmp_path, proc) == 2.0


def test_torch_threads_are_capped_at_the_usable_cores(monkeypatch):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(8)
        monkeypatch.setattr(threads, "usable_cores", lambda: 3)
        assert threads.fit_to_usable_cores() == 3
        assert torch.get_num_threads() == 3
        torch.set_num_threads(2)  # fewer than the cores: the user's choice stays
        assert threads.fit_to_usable_cores() == 2
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


_POOL_PROBE = textwrap.dedent(
    """
    import os, torch
    from engine.host.threads import release_pool
    torch.set_num_threads(2)
    x = torch.randn(512, 512)
    for _ in range(3):
        x @ x  # a parallel region: this thread now holds an OpenMP pool
    with_pool = len(os.listdir("/proc/self/task"))
    print(with_pool, release_pool(), len(os.listdir("/proc/self/task")))
    """
)


def test_releasing_a_thread_pool_ends_its_openmp_workers():
    """The call the policy rests on, in a fresh process: torch's OpenMP runtime frees the
    calling thread's pool, so its workers no longer count against the engine's team."""
    run = subprocess.run(
        [sys.executable, "-c", _POOL_PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "2"},
    )
    assert run.returncode == 0, run.stderr
    with_pool, released, after = run.stdout.split()
    assert released == "True"
    assert int(after) < int(with_pool)


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_the_engine_thread_owns_the_team_and_the_caller_runs_one_thread(
    tiny_llama_dir, two_threads
):
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig

    engine = AsyncEngine(EngineConfig(model=str(tiny_llama_dir), kv_cache_dtype="bf16"))
    try:
        assert torch.get_num_threads() == 1  # the caller: quieted
        engine_threads = asyncio.run(engine.call(torch.get_num_threads))
        assert engine_threads == 2

        seen = []  # a thread started later takes one thread too, not the engine's count
        worker = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        worker.start()
        worker.join()
        assert seen == [1]
    finally:
        engine.shutdown()
    assert torch.get_num_threads() == 2  # the caller's count comes back
