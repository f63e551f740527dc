"""The MLA latent pool (bf16 / fp8 rows, two scales) and both MLA attention paths over it."""

from __future__ import annotations

import math

import pytest
import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.mla import MLADims, choose_path, mla_attention
from engine.kv.mla_pool import MLALatentPool, MLALayout
from engine.kv.pools import make_pool
from engine.kv.sizing import KVLayout, kv_bytes_per_token

DIMS = MLADims(num_heads=4, nope_dim=16, rope_dim=8, v_dim=12, lora_rank=32)
LAYOUT = MLALayout(num_layers=2, kind="mla", latent_dim=40, rope_dim=8)
PAGE = 4


def make(kv_dtype: str, num_pages: int = 8) -> MLALatentPool:
    return MLALatentPool(LAYOUT, num_pages, PAGE, kv_dtype)


def test_kimi_sizes():
    kimi = MLALayout(num_layers=61, kind="mla", latent_dim=512 + 64, rope_dim=64)
    assert kv_bytes_per_token(kimi, "fp8_e4m3") == 35_136
    assert kv_bytes_per_token(kimi, "bf16") == 70_272
    pool = make_pool(kimi, num_pages=2, page_size=16, kv_dtype="fp8_e4m3", device="cpu")
    assert isinstance(pool, MLALatentPool)
    assert pool.nbytes == 2 * 16 * 35_136
    assert pool.capacity_tokens == 32


def test_pool_needs_to_know_where_the_rope_key_starts():
    with pytest.raises(ValueError, match="rope key"):
        MLALatentPool(KVLayout(num_layers=2, kind="mla", latent_dim=40), 4, PAGE, "bf16")
    with pytest.raises(ValueError, match="GQA"):
        MLALatentPool(KVLayout(num_layers=2, kind="gqa", num_kv_heads=2, head_dim=8), 4, 4, "bf16")


def test_bf16_rows_round_trip_exactly():
    pool = make("bf16")
    latent, rope = torch.randn(5, 32), torch.randn(5, 8)
    slots = torch.tensor([3, 9, 0, 17, 30])
    pool.write(1, latent, rope, slots)
    rows, latent_factor, rope_factor = pool.gather(1, slots.view(1, 5), torch.float32)
    assert (latent_factor, rope_factor) == (1.0, 1.0)
    assert torch.equal(rows[0, :, :32], latent.bfloat16().float())
    assert torch.equal(rows[0, :, 32:], rope.bfloat16().float())


def test_fp8_rows_have_one_scale_for_the_latent_and_one_for_the_rope_key():
    pool = make("fp8_e4m3")
    torch.manual_seed(0)
    latent, rope = torch.randn(16, 32), torch.randn(16, 8) * 40  # very different ranges
    slots = torch.arange(16)
    pool.write(0, latent, rope, slots)
    scales = pool.scales()
    assert scales["latent"][0] == pytest.approx(latent.abs().max().item() * 1.25 / 448)
    assert scales["rope"][0] == pytest.approx(rope.abs().max().item() * 1.25 / 448)
    assert pool.scales()["latent"][1] == 1.0  # layer 1 not written yet
    rows, latent_factor, rope_factor = pool.gather(0, slots, torch.float32)
    for got, want, scale in (
        (rows[:, :32] * latent_factor, latent, scales["latent"][0]),
        (rows[:, 32:] * rope_factor, rope, scales["rope"][0]),
    ):
        # e4m3: 3 mantissa bits (relative error <= 2**-4), subnormal spacing 2**-9 * scale.
        bound = want.abs() * 2**-4 + scale * 2**-9
        assert bool(((got - want).abs() <= bound).all())
    # Scales are frozen after calibration: a later, larger write saturates instead.
    pool.write(0, latent * 100, rope, torch.arange(16, 32))
    assert pool.scales()["latent"][0] == scales["latent"][0]


def test_fixed_scales_are_validated_and_kept():
    pool = make("fp8_e4m3")
    with pytest.raises(ValueError, match="expected 2"):
        pool.set_scales(torch.ones(3), torch.ones(2), "file")
    with pytest.raises(ValueError, match="positive"):
        pool.set_scales(torch.ones(2), torch.zeros(2), "file")
    pool.set_scales(torch.tensor([0.5, 0.25]), torch.tensor([2.0, 4.0]), "checkpoint")
    pool.write(0, torch.randn(3, 32), torch.randn(3, 8), torch.arange(3))
    assert pool.scales() == {"latent": [0.5, 0.25], "rope": [2.0, 4.0]}
    assert pool.scale_source == "checkpoint"


class Step:
    """Two sequences in one step: A has 5 cached tokens and 3 new, B is a 4-token prefill."""

    pages = {"a": [2, 5], "b": [0, 3]}
    cached = {"a": 5, "b": 0}
    new = {"a": 3, "b": 4}

    @classmethod
    def slots(cls, name: str, start: int, end: int) -> torch.Tensor:
        positions = torch.arange(start, end)
        table = torch.tensor(cls.pages[name])
        return table[positions // PAGE] * PAGE + positions % PAGE

    @classmethod
    def metadata(cls) -> AttentionMetadata:
        ends = {n: cls.cached[n] + cls.new[n] for n in ("a", "b")}
        return AttentionMetadata.build(
            query_lens=[cls.new["a"], cls.new["b"]],
            context_lens=[ends["a"], ends["b"]],
            slot_mapping=torch.cat([cls.slots(n, cls.cached[n], ends[n]) for n in ("a", "b")]),
            context_slots=[cls.slots(n, 0, ends[n]) for n in ("a", "b")],
            device=torch.device("cpu"),
        )


def reference_attention(pool, layer, q_nope, q_rope, kv_b, scale):
    """Float64, per sequence and head, from the values the pool stores (dequantized)."""
    outputs = []
    offset = 0
    for name in ("a", "b"):
        total = Step.cached[name] + Step.new[name]
        rows, lf, rf = pool.gather(layer, Step.slots(name, 0, total), torch.float64)
        latent, rope = rows[:, : DIMS.lora_rank] * lf, rows[:, DIMS.lora_rank :] * rf
        per_head = kv_b.double().view(DIMS.num_heads, DIMS.nope_dim + DIMS.v_dim, DIMS.lora_rank)
        for t in range(Step.new[name]):
            position = Step.cached[name] + t
            heads = []
            for h in range(DIMS.num_heads):
                k_nope = latent[: position + 1] @ per_head[h, : DIMS.nope_dim].T
                v = latent[: position + 1] @ per_head[h, DIMS.nope_dim :].T
                scores = k_nope @ q_nope[offset + t, h].double()
                scores = scores + rope[: position + 1] @ q_rope[offset + t, h].double()
                heads.append(torch.softmax(scores * scale, dim=0) @ v)
            outputs.append(torch.stack(heads))
        offset += Step.new[name]
    return torch.stack(outputs)


@pytest.mark.parametrize(
    "kv_dtype, tolerance", [("float32", 1e-5), ("bf16", 1e-5), ("fp8_e4m3", 1e-5)]
)
def test_absorbed_and_expanded_paths_match_a_reference(kv_dtype, tolerance):
    torch.manual_seed(0)
    pool = make(kv_dtype)
    kv_b = torch.randn(DIMS.num_heads * (DIMS.nope_dim + DIMS.v_dim), DIMS.lora_rank) * 0.2
    scale = (DIMS.nope_dim + DIMS.rope_dim) ** -0.5
    # A's cached prefix went in during an earlier step (it also calibrates fp8 scales).
    pool.write(1, torch.randn(5, 32), torch.randn(5, 8) * 3, Step.slots("a", 0, 5))
    tokens = Step.new["a"] + Step.new["b"]
    q_nope, q_rope = torch.randn(tokens, 4, 16), torch.randn(tokens, 4, 8)
    latent, k_rope = torch.randn(tokens, 32), torch.randn(tokens, 8) * 3
    meta = Step.metadata()
    results = {}
    for path in ("absorbed", "expanded"):
        results[path] = mla_attention(
            1, q_nope, q_rope, latent, k_rope, kv_b, pool, meta, DIMS, scale, path
        )
        assert results[path].shape == (tokens, DIMS.num_heads, DIMS.v_dim)
    expected = reference_attention(pool, 1, q_nope, q_rope, kv_b, scale).float()
    for path, got in results.items():
        diff = (got - expected).abs().max().item()
        assert diff < tolerance, f"{path} path, {kv_dtype} cache: max |diff| {diff}"


def test_path_choice_absorbs_for_decode_and_expands_for_long_prefill():
    kimi = MLADims(num_heads=64, nope_dim=128, rope_dim=64, v_dim=128, lora_rank=512)

    def meta(queries: int, context: int) -> AttentionMetadata:
        return AttentionMetadata.build(
            [queries],
            [context],
            torch.arange(context - queries, context),
            [torch.arange(context)],
            torch.device("cpu"),
        )

    assert choose_path(meta(1, 4096), kimi) == "absorbed"
    assert choose_path(meta(2048, 2048), kimi) == "expanded"
    assert choose_path(meta(16, 100_000), kimi) == "absorbed"  # a chunk on a long cached prefix
    assert math.isclose(kimi.lora_rank + kimi.rope_dim, 576)


def _slots(pages: list[int], start: int, end: int) -> torch.Tensor:
    positions = torch.arange(start, end)
    return torch.tensor(pages)[positions // PAGE] * PAGE + positions % PAGE


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
def test_a_mixed_step_attends_each_sequence_as_it_would_alone(kv_dtype):
    """Two decode tokens beside a 3-token chunk over a cached prefix and a fresh 4-token
    prefill: the step is cut into the decode sequences together and each other sequence
    alone (no sequence padded to another's queries), and each gets what it gets alone."""
    torch.manual_seed(1)
    pages = {"d1": [0], "p1": [1, 2], "d2": [3], "p2": [4]}
    cached = {"d1": 2, "p1": 4, "d2": 3, "p2": 0}
    new = {"d1": 1, "p1": 3, "d2": 1, "p2": 4}
    order = list(pages)
    kv_b = torch.randn(DIMS.num_heads * (DIMS.nope_dim + DIMS.v_dim), DIMS.lora_rank) * 0.2
    scale = (DIMS.nope_dim + DIMS.rope_dim) ** -0.5
    prefix = {n: (torch.randn(cached[n], 32), torch.randn(cached[n], 8) * 3) for n in order}
    tokens = sum(new.values())
    q_nope, q_rope = torch.randn(tokens, 4, 16), torch.randn(tokens, 4, 8)
    latent, k_rope = torch.randn(tokens, 32), torch.randn(tokens, 8) * 3

    def pool_with_prefixes():
        pool = make(kv_dtype, num_pages=8)
        # One earlier write of every prefix (it also sets fp8 scales once for both runs).
        slots = torch.cat([_slots(pages[n], 0, cached[n]) for n in order])
        pool.write(
            0,
            torch.cat([prefix[n][0] for n in order]),
            torch.cat([prefix[n][1] for n in order]),
            slots,
        )
        return pool

    def meta_of(names):
        return AttentionMetadata.build(
            query_lens=[new[n] for n in names],
            context_lens=[cached[n] + new[n] for n in names],
            slot_mapping=torch.cat(
                [_slots(pages[n], cached[n], cached[n] + new[n]) for n in names]
            ),
            context_slots=[_slots(pages[n], 0, cached[n] + new[n]) for n in names],
            device=torch.device("cpu"),
        )

    meta = meta_of(order)
    groups = meta.ragged_groups()
    assert [g[1].query_lens for g in groups] == [[1, 1], [3], [4]]
    together = mla_attention(
        0, q_nope, q_rope, latent, k_rope, kv_b, pool_with_prefixes(), meta, DIMS, scale
    )
    alone_pool, start, parts = pool_with_prefixes(), 0, []
    for n in order:
        rows = slice(start, start + new[n])
        parts.append(
            mla_attention(
                0,
                q_nope[rows],
                q_rope[rows],
                latent[rows],
                k_rope[rows],
                kv_b,
                alone_pool,
                meta_of([n]),
                DIMS,
                scale,
            )
        )
        start += new[n]
    assert torch.allclose(together, torch.cat(parts), rtol=0, atol=1e-5)
