"""TUI tests are async (Textual's pilot): anyio's pytest plugin runs them on asyncio."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
