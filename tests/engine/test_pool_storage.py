"""KV pool storage on CPU: slot 0 zero (padded decode rows read it), the rest resident
only as tokens fill it, so a large default pool costs no memory at start-up."""

from __future__ import annotations

import resource

import pytest
import torch

from engine.kv.mla_pool import MLALatentPool, MLALayout
from engine.kv.pool import PagedKVPool
from engine.kv.sizing import KVLayout

POOL_MIB = 512


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def _gqa_pool():
    layout = KVLayout(num_layers=4, kind="gqa", num_kv_heads=8, head_dim=128)
    slot_bytes = 4 * 2 * 8 * 128 * 2  # layers, K and V, heads, dims, bf16
    return PagedKVPool(layout, POOL_MIB * 2**20 // (16 * slot_bytes), 16, "bf16")


def _mla_pool():
    layout = MLALayout(num_layers=4, kind="mla", latent_dim=576, rope_dim=64)
    return MLALatentPool(layout, POOL_MIB * 2**20 // (16 * 4 * 576), 16, "fp8_e4m3")


@pytest.mark.parametrize("make", [_gqa_pool, _mla_pool], ids=["gqa", "mla"])
def test_a_new_pool_is_not_resident_until_written(make):
    before = _resident_bytes()
    pool = make()
    grown = _resident_bytes() - before
    assert pool.nbytes >= POOL_MIB * 2**20 * 0.9
    assert grown < pool.nbytes / 8, (grown, pool.nbytes)
    assert not pool.storage[:, 0].view(torch.uint8).any()  # slot 0: zero bytes
