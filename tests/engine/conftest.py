"""Shared fixtures: tiny random checkpoints built once per test session."""

from __future__ import annotations

import pytest

from tests.engine import checkpoints


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    return checkpoints.tiny_llama(tmp_path_factory.mktemp("llama") / "model")


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory):
    return checkpoints.tiny_qwen2(tmp_path_factory.mktemp("qwen2") / "model")


@pytest.fixture(scope="session")
def tiny_glm4_dir(tmp_path_factory):
    return checkpoints.tiny_glm4(tmp_path_factory.mktemp("glm4") / "model")


def count_calls(monkeypatch, module, name: str) -> list[int]:
    """Wrap `module.name` so each call appends to the returned list (proves a kernel ran)."""
    calls: list[int] = []
    original = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(1) or original(*a, **k))
    return calls
