"""The KV disk tier after a crash: a save killed mid-write or before its rename, a
full disk, pages damaged by hand. Real processes die at chosen points; a restart
removes and reports what they left, and never trusts a page it has not checked
whole."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from engine import LLM, SamplingParams
from engine.kv.disk_files import STALE_AFTER_S, evict, remove_stale_temporaries
from engine.kv.disk_tier import DiskTier, PageRecord

ROOT = Path(__file__).resolve().parents[2]
PREFIX = list(range(3, 3 + 80))  # five full 16-token pages
GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
LIMIT = 1000  # bytes a killed writer gets into its page file: less than one page (~2.3 kB)

# A real engine that prefills PREFIX and saves it, dying at the point named in argv[3]:
# - mid-write: the kernel kills it (SIGXFSZ, default action) when the page file being
#   written reaches LIMIT bytes; Python ignores SIGXFSZ, so the default is put back;
# - before-rename: SIGKILL once the first page's temporary is whole, before its rename;
# - disk-full: the same limit with SIGXFSZ ignored: the write fails (EFBIG), as on a
#   full disk, and the process lives on to say so.
CHILD = """
import os, resource, signal, sys
from engine import LLM, SamplingParams
model, disk, point, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
llm = LLM(model, dtype="float32", kv_cache_dtype="fp8_e4m3", kv_disk=True, kv_disk_dir=disk)
prefix = list(range(3, 83))
llm.generate([prefix + [7, 8, 9]], SamplingParams(max_tokens=1, temperature=0))
if point == "mid-write":
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
elif point == "disk-full":
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
elif point == "before-rename":
    replace = os.replace
    def dying(src, dst):
        if str(src).endswith(".tmp") and str(dst).endswith(".kvp"):
            os.kill(os.getpid(), signal.SIGKILL)
        replace(src, dst)
    os.replace = dying
try:
    llm.engine.save_prefix(prefix)
except OSError as err:
    print("save failed:", err.errno)
    sys.exit(0)
print("saved")
"""


def run_child(model_dir: Path, disk: Path, point: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(model_dir), str(disk), point, str(LIMIT)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def make(model_dir, disk, **overrides) -> LLM:
    settings = dict(dtype="float32", kv_cache_dtype="fp8_e4m3", kv_disk=True)
    settings.update(overrides)
    return LLM(str(model_dir), kv_disk_dir=str(disk), **settings)


def temporaries(disk: Path) -> list[Path]:
    return sorted(disk.rglob("*.tmp"))


def pages(disk: Path) -> list[Path]:
    return sorted(disk.glob("*/pages/*.kvp"))


def tier_lines(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("engine.kv"))


@pytest.mark.parametrize("point", ["mid-write", "before-rename"])
def test_a_save_killed_mid_way_is_cleaned_up_and_reported_on_restart(
    tiny_llama_dir, tmp_path, caplog, point
):
    disk = tmp_path / "kv"
    child = run_child(tiny_llama_dir, disk, point)
    killed_by = signal.SIGXFSZ if point == "mid-write" else signal.SIGKILL
    assert child.returncode == -killed_by, child.stderr[-2000:]
    (left,) = temporaries(disk)  # the page being written when it died
    assert ".kvp." in left.name and not pages(disk)
    size = left.stat().st_size
    assert size == LIMIT if point == "mid-write" else size > LIMIT

    with caplog.at_level(logging.INFO, logger="engine.kv"):
        restarted = make(tiny_llama_dir, disk)
    assert temporaries(disk) == []
    assert f"removed 1 temporary file(s), {size} bytes" in tier_lines(caplog)
    # The restarted engine saves and restores as if nothing had happened.
    expected = restarted.generate([PREFIX + [7]], GREEDY)[0].outputs[0].token_ids
    assert restarted.engine.save_prefix(PREFIX) == 5
    again = make(tiny_llama_dir, disk)
    assert again.engine.restore_prefix(PREFIX) == 80
    assert again.generate([PREFIX + [7]], GREEDY)[0].outputs[0].token_ids == expected


def test_a_failed_write_on_a_full_disk_leaves_no_temporary(tiny_llama_dir, tmp_path):
    disk = tmp_path / "kv"
    child = run_child(tiny_llama_dir, disk, "disk-full")
    assert child.returncode == 0 and "save failed: 27" in child.stdout, child.stderr[-2000:]
    assert temporaries(disk) == [] and pages(disk) == []  # EFBIG: nothing partial stays


def _dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
    )
    return int(done.stdout)


def test_only_temporaries_no_live_writer_owns_are_removed(tmp_path):
    pages_dir = tmp_path / "kv" / "engine" / "pages"
    pages_dir.mkdir(parents=True)
    live = pages_dir / f".000000-aa.kvp.{os.getpid()}.tmp"  # this process, writing now
    dead = pages_dir / f".000001-bb.kvp.{_dead_pid()}.tmp"
    old = pages_dir / f".000002-cc.kvp.{os.getppid()}.tmp"  # a live PID, untouched for long
    for path in (live, dead, old):
        path.write_bytes(b"x" * 100)
    aged = os.path.getmtime(old) - STALE_AFTER_S - 60
    os.utime(old, (aged, aged))
    assert remove_stale_temporaries(tmp_path / "kv") == (2, 200)
    assert [p.name for p in temporaries(tmp_path)] == [live.name]


def test_eviction_counts_every_byte_in_the_folder(tmp_path):
    root = tmp_path / "kv"
    tier = DiskTier(root, "engine", budget_bytes=10**9)
    keys = [bytes([i]) * 16 for i in range(4)]
    for depth, key in enumerate(keys):
        tier.put_page(PageRecord(key, b"\0" * 16, depth, [depth], "", b"x" * 1000))
    page = tier.page_path(0, keys[0]).stat().st_size
    # A live writer's temporary and a file nobody knows take room the budget must count.
    (root / "engine" / "pages" / f".000009-ff.kvp.{os.getpid()}.tmp").write_bytes(b"t" * page)
    (root / "stray.bin").write_bytes(b"s" * page)
    assert evict(root, 4 * page) == 2  # 6 files of a page each into a budget of 4
    assert len(pages(root)) == 2
    # A dead writer's temporary is removed before any page has to go.
    (root / "engine" / "pages" / f".000008-ee.kvp.{_dead_pid()}.tmp").write_bytes(b"d" * page)
    assert evict(root, 4 * page) == 0 and len(pages(root)) == 2
    assert len(temporaries(root)) == 1


@pytest.fixture(scope="module")
def saved_tier(tiny_llama_dir, tmp_path_factory):
    disk = tmp_path_factory.mktemp("saved") / "kv"
    llm = make(tiny_llama_dir, disk)
    llm.generate([PREFIX + [7]], GREEDY)
    assert llm.engine.save_prefix(PREFIX) == 5
    return disk


def _damage(path: Path, kind: str) -> None:
    data = path.read_bytes()
    if kind == "cut":
        path.write_bytes(data[:10])
    elif kind == "random":
        path.write_bytes(os.urandom(len(data)))
    elif kind == "flipped":
        path.write_bytes(
            data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 1]) + data[len(data) // 2 + 1 :]
        )
    else:  # "truncated"
        path.write_bytes(data[:-100])


@pytest.mark.parametrize("kind", ["cut", "random", "flipped", "truncated"])
def test_a_starting_server_checks_every_page_whole(
    saved_tier, tiny_llama_dir, tmp_path, caplog, kind
):
    disk = tmp_path / "kv"
    shutil.copytree(saved_tier, disk)
    damaged = pages(disk)[2]
    _damage(damaged, kind)
    fresh = make(tiny_llama_dir, disk)
    with caplog.at_level(logging.INFO, logger="engine.kv"):
        chains = fresh.engine.prefix_store.saved_prefixes()
    assert not damaged.exists()  # removed, never left for the next start to skip again
    lines = tier_lines(caplog)
    assert "removed 1 damaged page file(s)" in lines
    assert "2 saved page(s) followed a damaged one" in lines  # pages 3 and 4
    assert [tokens for tokens, _ in chains] == [PREFIX[:32]]
    assert fresh.engine.prefix_store.restore_saved() == 32


def test_a_restore_that_meets_a_damaged_page_reports_the_cut_off_chain(
    saved_tier, tiny_llama_dir, tmp_path, caplog
):
    disk = tmp_path / "kv"
    shutil.copytree(saved_tier, disk)
    _damage(pages(disk)[1], "flipped")
    fresh = make(tiny_llama_dir, disk)
    with caplog.at_level(logging.WARNING, logger="engine.kv"):
        assert fresh.engine.restore_prefix(PREFIX) == 16
    assert "the 3 saved page(s) after it in this prefix are cut off" in tier_lines(caplog)
