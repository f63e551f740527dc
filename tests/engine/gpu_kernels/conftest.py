"""GPU kernel tests: on CPU under Triton's interpreter, on a GPU compiled.

TRITON_INTERPRET must be set before any kernel is decorated (when an
engine.gpu_kernels kernel module is first imported), so it is set here, at
collection, and only when there is no GPU. Each test draws fresh random
inputs; its seed is in the failure report (replay with TRITON_TEST_SEED=<seed>).
Shapes are tiny: the interpreter runs every program in numpy.
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
