"""RESIDENT_CACHE_DIR survives the agent's environment scrub: the local engine's KV disk
tier goes where the person said, never to the user cache."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from agent.core.process_guard import CONFIG_NAMES
from tests.engine.checkpoints import tiny_llama

ROOT = Path(__file__).resolve().parents[2]
# RESIDENT_ names in the code that are not settings read after the guard runs:
NOT_READ_AFTER_THE_GUARD = {
    "RESIDENT_API_KEY",  # a secret: read into --api-key before the scrub, on purpose
    "RESIDENT_LLAMA_CPP",  # `resident bench`, which runs no agent and scrubs nothing
    "RESIDENT_SOURCES",  # a tuple of choices in the benchmarks, no variable
    "RESIDENT_HOOK_EVENT",  # set for hook commands, never read by the agent
    "RESIDENT_SESSION_ID",
    "RESIDENT_WORKSPACE",
}


def test_every_resident_setting_survives_the_scrub():
    """A RESIDENT_ variable the code reads is scrubbed as secret-looking unless
    CONFIG_NAMES keeps it; a new one must be placed on one side or the other."""
    names = set()
    for package in ("agent", "engine", "tools"):
        for path in (ROOT / package).rglob("*.py"):
            names.update(re.findall(r"\bRESIDENT_[A-Z][A-Z0-9_]*\b", path.read_text()))
    assert "RESIDENT_CACHE_DIR" in names
    assert names - NOT_READ_AFTER_THE_GUARD - CONFIG_NAMES == set()


def test_the_local_engine_keeps_its_kv_where_resident_cache_dir_says(tmp_path):
    """A real `resident run` on a local model: the resident prefix's pages are saved
    under $RESIDENT_CACHE_DIR/kv, and nothing under the user cache."""
    model = tiny_llama(tmp_path / "model", max_position_embeddings=4096)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "a.py").write_text("def f():\n    return 1\n")
    env = {
        **os.environ,
        "RESIDENT_CACHE_DIR": str(tmp_path / "cache"),
        "XDG_CACHE_HOME": str(tmp_path / "user-cache"),
        "RESIDENT_NO_SANDBOX": "1",
        "PYTHONPATH": str(ROOT),
    }
    run = subprocess.run(
        [sys.executable, "-m", "agent.cli", "run", "hi", "--model", str(model), "--json"]
        + ["--tools", "read", "--approval", "read-only", "--max-tokens", "2", "--max-turns", "1"],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert list((tmp_path / "cache" / "kv").glob("*/pages/*.kvp"))
    assert not (tmp_path / "user-cache" / "resident" / "kv").exists()
