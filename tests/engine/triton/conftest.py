"""Triton kernel tests: on CPU they run under Triton's interpreter, on a GPU compiled.

TRITON_INTERPRET must be set before any kernel is decorated (when
engine.attention.triton's kernel modules are first imported), so it is set
here, at collection, and only when there is no GPU. Every test draws fresh
random inputs; the seed is in each test's report line so a failure can be
replayed with TRITON_TEST_SEED=<seed>.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture
def seed(request) -> int:
    value = int(os.environ.get("TRITON_TEST_SEED") or random.SystemRandom().randrange(2**31))
    torch.manual_seed(value)
    request.node.user_properties.append(("seed", value))
    return value


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pytest_runtest_makereport(item, call):
    if call.when == "call" and call.excinfo is not None:
        seeds = [value for key, value in item.user_properties if key == "seed"]
        if seeds:
            item.add_report_section("call", "seed", f"TRITON_TEST_SEED={seeds[0]}")
