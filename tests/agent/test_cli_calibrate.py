"""`resident models calibrate`: FP8 KV scales from a folder of the user's text, written as
the file `resident serve --kv-scales` reads; bad paths are usage errors (exit 2)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agent.cli import app
from engine import LLM
from engine.devtools.testing import checkpoints

runner = CliRunner()
SOURCE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n" * 30


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return checkpoints.tiny_llama(tmp_path_factory.mktemp("calibrate") / "model")


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "src" / "calc.py").write_text(SOURCE)
    (root / "notes.md").write_text("# Notes\n" + "The calculator adds and subtracts.\n" * 40)
    (root / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0" * 100)  # binary: left out
    (root / ".gitignore").write_text("build/\n")
    (root / "build").mkdir()
    (root / "build" / "out.txt").write_text("ignored " * 500)  # ignored: left out
    return root


def calibrate(model, *args: str):
    return runner.invoke(app, ["models", "calibrate", "--model", str(model), *args])


def test_calibrates_on_a_folder_and_serve_reads_the_file(tiny_model, project, tmp_path):
    out = tmp_path / "scales.json"
    result = calibrate(tiny_model, str(project), "-o", str(out), "--window", "128", "--json")
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed["files"] == 3  # calc.py, notes.md, .gitignore; not the PNG or build/
    assert printed["kv_rotation"] == "hadamard" and printed["window_tokens"] == 128
    written = json.loads(out.read_text())
    assert written == printed and written["format"] == "resident-kv-scales"
    served = LLM(str(tiny_model), dtype="float32", kv_scales_file=str(out))
    assert served.engine.kv_rotation == "hadamard"
    assert served.engine.pool.scale_source == "file"
    assert served.engine.pool.scales() == {"k": written["k"], "v": written["v"]}


def test_per_head_and_without_rotation(tiny_model, project, tmp_path):
    out = tmp_path / "scales.json"
    args = [str(project / "src" / "calc.py"), "-o", str(out), "--kv-rotation", "none"]
    result = calibrate(tiny_model, *args, "--kv-scales-per-head", "--max-windows", "2")
    assert result.exit_code == 0, result.output
    assert "serve with: resident serve" in result.stdout and str(out) in result.stdout
    written = json.loads(out.read_text())
    assert written["kv_rotation"] == "none" and written["granularity"] == "per_head"
    assert written["windows"] <= 2


def test_bad_paths_are_usage_errors_and_write_nothing(tiny_model, project, tmp_path):
    out = tmp_path / "scales.json"
    cases = [
        ([str(project / "missing"), "-o", str(out)], "no such file"),
        ([str(project / "logo.png"), "-o", str(out)], "binary"),
        ([str(project), "-o", str(tmp_path / "nowhere" / "s.json")], "does not exist"),
        ([str(project / "build"), "-o", str(out), "--kv-rotation", "sideways"], "--kv-rotation"),
        ([str(project), "-o", str(out), "--dtype", "half"], "--dtype"),
    ]
    empty = tmp_path / "empty"
    empty.mkdir()
    cases.append(([str(empty), "-o", str(out)], "no text files"))
    for args, message in cases:
        result = calibrate(tiny_model, *args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output and "Traceback" not in result.output
    assert not out.exists()
