"""TritonAttentionBackend: the torch backend's interface, on Triton kernels.

Same contract as engine.attention.torch_backend.TorchAttentionBackend: write
this step's K and V to the pool first, then attend over each sequence's
context read back from the pool (DESIGN.md §3). Decode-only steps use the
split-K decode kernel, every other step the prefill kernel. MLA models call
`mla_decode` through the hook in engine.attention.mla for decode steps on
the absorbed path; other MLA steps stay on the torch paths. For DeepSeek
sparse attention it also scores a decode step's context for the indexer
(`index_scores`) and attends over the selected slots (step_tables reads a
selection as one-token pages).

Scales reach the kernels as float32 [kv_heads] tensors from
`pool.layer_scales(layer)` (per-tensor scales repeated per head), so
per-KV-head scales need no kernel change. While a layer's FP8 scales are
still to be calibrated, or the pool is observing what is written, the pool's
own write runs instead of the kernel.

GQA layers first ask `rope_rotate_write` for the fused path (rope_write.py:
rotary, the Hadamard K/V rotation and the KV write as one kernel), then
`attend`; where it does not apply (it returns None) they run rotary and
rotation themselves and call `forward`, which is the write and `attend`.
"""

from __future__ import annotations

import logging

import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.triton import (
    interpreting,
    triton_untested,
    triton_version,
    triton_version_problem,
)
from engine.attention.triton.common import choose_fp8_dot, step_tables
from engine.attention.triton.decode import gqa_decode
from engine.attention.triton.index_scores import paged_index_scores
from engine.attention.triton.kv_write import write_gqa, write_mla
from engine.attention.triton.mla_decode import mla_decode
from engine.attention.triton.prefill import prefill_attention
from engine.attention.triton.rope_write import fused_rope_write_applies, rope_rotate_write
from engine.errors import EngineError

log = logging.getLogger(__name__)


def needs_pool_write(pool, layer: int) -> bool:
    """Whether this write must go through the pool's own (torch) write.

    FP8 pools calibrate a layer's scales on its first write and can record the
    maxima of everything written (`observe`, for calibrating over a prompt
    set); both happen inside pool.write. When the pool does not say (no such
    attributes), the pool writes: slower, never wrong.
    """
    if not pool.is_fp8:
        return False
    calibrated = getattr(pool, "_calibrated", None)
    if calibrated is None or not calibrated[layer]:
        return True
    return getattr(pool, "_observed", None) is not None


class TritonAttentionBackend:
    name = "triton"
    # Whether GQA layers get the fused rotary + rotation + KV write (rope_rotate_write);
    # off, they run the three steps (tests and benchmarks compare the two).
    fuse_rope_write = True
    # mla_decode reads each sequence's context from the metadata, as one-token pages when it
    # holds a DSA selection (step_tables): sparse decode runs here, not on torch.
    mla_decode_reads_context_slots = True

    def __init__(self, fallback=None):
        # The engine builds its backend at start: a Triton too old for the kernels
        # is reported here, not as a compile error in the middle of a request.
        problem = triton_version_problem()
        if problem is not None:
            raise EngineError(problem)
        if triton_untested():
            log.warning(
                "Triton %s is newer than any the kernels were compile-checked with; "
                "python -m engine.devtools.kernel_check checks this one",
                ".".join(map(str, triton_version() or ())),
            )
        # With a fallback ("auto"), tensors the kernels cannot run on (CPU
        # without the interpreter) go to it; without one they are an error.
        self.fallback = fallback
        self.mla_decode_calls = 0  # how often MLA decode ran here (benchmarks report it)
        self.rope_write_calls = 0  # how often the fused rotary + KV write ran (likewise)
        self.index_score_calls = 0  # how often the DSA indexer scored a decode step here
        # Decode over FP8 pages on e4m3 tensor cores: None is the kernels' default (where
        # the GPU has them); False widens the bytes instead (exact comparisons in tests).
        self.fp8_dot: bool | None = None
        self._scales: dict[tuple, object] = {}  # device copies of scales, see _layer_scales

    def describe(self, pool, dtype: torch.dtype) -> dict[str, str]:
        """What /v1/engine/stats says of decode over `pool` with activations of `dtype`:
        whether FP8 pages multiply on e4m3 tensor cores (`choose_fp8_dot`)."""
        if not pool.is_fp8:
            return {}
        query = torch.empty(0, dtype=dtype, device=pool.storage.device)
        on = choose_fp8_dot(query, pool.storage, self.fp8_dot)
        return {"fp8_decode_dots": "on" if on else "off"}

    def _runs_here(self, x: torch.Tensor) -> bool:
        if x.is_cuda or interpreting():
            return True
        if self.fallback is None:
            raise EngineError(
                "the triton attention backend runs on CUDA tensors (or on CPU under "
                "TRITON_INTERPRET=1, for tests); use --attention-backend torch on CPU"
            )
        return False

    def _layer_scales(self, pool, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """pool.layer_scales(layer) on the device, cached until the scales change.

        The key holds the scale tensors' identity and in-place version, so a
        calibration or set_scales is seen; without those attributes, no cache.
        """
        k, v = getattr(pool, "k_scale", None), getattr(pool, "v_scale", None)
        if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor):
            return pool.layer_scales(layer)
        key = (id(pool), layer, id(k), k._version, id(v), v._version)
        cached = self._scales.get(key)
        if cached is None:
            self._scales = {kk: vv for kk, vv in self._scales.items() if kk[:2] != key[:2]}
            cached = self._scales[key] = pool.layer_scales(layer)
        return cached

    def _mla_layer_scales(self, pool, layer: int) -> tuple[float, float, torch.Tensor | None]:
        """(latent scale, rope scale, both as a float32 device tensor for the write kernel),
        cached until the pool's scale tensors change, as _layer_scales: a decode step then
        reads nothing back from a tensor (what a CUDA-graph capture needs); None for BF16."""
        if not pool.is_fp8:
            return 1.0, 1.0, None
        latent, rope = pool.latent_scale, pool.rope_scale
        key = (id(pool), layer, "mla", id(latent), latent._version, id(rope), rope._version)
        cached = self._scales.get(key)
        if cached is None:
            self._scales = {kk: vv for kk, vv in self._scales.items() if kk[:2] != key[:2]}
            values = (float(latent[layer]), float(rope[layer]))
            tensor = torch.tensor(values, dtype=torch.float32).to(pool.storage.device)
            cached = self._scales[key] = (*values, tensor)
        return cached

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        pool,
        meta: AttentionMetadata,
        softmax_scale: float,
    ) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] -> attention output [T, Hq, D]: the KV write, then
        `attend`."""
        if not self._runs_here(q):
            return self.fallback.forward(layer, q, k, v, pool, meta, softmax_scale)
        if needs_pool_write(pool, layer):
            pool.write(layer, k, v, meta.slot_mapping)
        else:
            k_scales, v_scales = self._layer_scales(pool, layer)
            write_gqa(pool.storage[layer], meta.slot_mapping, k, v, k_scales, v_scales)
        return self.attend(layer, q, pool, meta, softmax_scale)

    def attend(
        self, layer: int, q: torch.Tensor, pool, meta: AttentionMetadata, softmax_scale: float
    ) -> torch.Tensor:
        """Attention of q [T, Hq, D] over the context in the pool, this step's K/V already
        written (by `forward` or `rope_rotate_write`) -> [T, Hq, D]."""
        storage = pool.storage[layer]
        k_scales, v_scales = self._layer_scales(pool, layer)
        tables = step_tables(meta, pool.page_size)
        if meta.decode_only:
            return gqa_decode(
                q, storage, tables, k_scales, v_scales, softmax_scale, fp8_dot=self.fp8_dot
            )
        return prefill_attention(q, storage, tables, k_scales, v_scales, softmax_scale)

    def rope_rotate_write(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        positions: torch.Tensor,
        rotary,
        rotation,
        pool,
        meta: AttentionMetadata,
    ) -> torch.Tensor | None:
        """Rotary on q and k, the K/V rotation (`rotation`: a HadamardRotation or None) on
        q, k and v, and the K/V write, as one kernel -> the rotated q [T, Hq, D] for `attend`.

        q, k, v as the qkv projection gives them (before rotary); `rotary` a
        RotaryEmbedding. None, with nothing done, where the kernel does not apply: turned
        off, tensors it cannot run on (CPU without the interpreter), a pool that must
        write itself (calibrating or observing this layer), deterministic mode's
        butterfly rotation, tables or layouts the kernel does not take. The caller then
        runs the three steps and `forward`.
        """
        if not self.fuse_rope_write or not (q.is_cuda or interpreting()):
            return None
        if getattr(pool, "layout_kind", None) != "gqa" or needs_pool_write(pool, layer):
            return None
        storage = pool.storage[layer]
        if not fused_rope_write_applies(q, k, v, positions, rotary, rotation, storage):
            return None
        k_scales, v_scales = self._layer_scales(pool, layer) if pool.is_fp8 else (None, None)
        rotated = rope_rotate_write(
            q,
            k,
            v,
            positions,
            rotary.cos,
            rotary.sin,
            rotary.rotary_dim,
            rotary.interleaved,
            None if rotation is None else rotation.block,
            storage,
            meta.slot_mapping,
            k_scales,
            v_scales,
        )
        self.rope_write_calls += 1
        return rotated

    def mla_decode(
        self,
        layer: int,
        q_nope: torch.Tensor,
        q_rope: torch.Tensor,
        latent: torch.Tensor,
        k_rope: torch.Tensor,
        kv_b_weight: torch.Tensor,
        pool,
        meta: AttentionMetadata,
        dims,
        softmax_scale: float,
    ) -> torch.Tensor | None:
        """Absorbed MLA for a decode step -> [B, H, v_dim]; None leaves the step to torch.

        Shapes as engine.attention.mla.mla_attention: q_nope [B, H, nope],
        q_rope [B, H, rope] (rotated), latent [B, lora_rank], k_rope [B, rope].
        """
        if not meta.decode_only or not self._runs_here(q_nope):
            return None
        storage = pool.storage[layer]
        through_pool = needs_pool_write(pool, layer)
        if through_pool:
            pool.write(layer, latent, k_rope, meta.slot_mapping)
        latent_scale, rope_scale, scales = self._mla_layer_scales(pool, layer)
        if not through_pool:
            write_mla(storage, meta.slot_mapping, latent, k_rope, scales)
        h, r = dims.num_heads, dims.lora_rank
        per_head = kv_b_weight.view(h, dims.nope_dim + dims.v_dim, r)
        w_uk, w_uv = per_head[:, : dims.nope_dim], per_head[:, dims.nope_dim :]
        q_latent = torch.einsum("thn,hnr->thr", q_nope, w_uk)
        queries = torch.cat([q_latent, q_rope.to(q_latent.dtype)], dim=-1)
        tables = step_tables(meta, pool.page_size)
        out_latent = mla_decode(
            queries, storage, tables, r, latent_scale, rope_scale, softmax_scale,
            fp8_dot=self.fp8_dot,
        )  # fmt: skip
        self.mla_decode_calls += 1
        return torch.einsum("thr,hvr->thv", out_latent, w_uv)

    def index_scores(
        self,
        layer: int,
        queries: torch.Tensor,
        weights: torch.Tensor,
        pool,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor | None:
        """The lightning indexer's scores for a decode step, from the keys on their pages
        -> [B, L] float32, -inf past each sequence's length; None leaves it to torch.

        queries [B, H, D] (rotated), weights [B, H] float32; `layer` keeps indexer
        keys in `pool` (a DSALatentPool). engine/attention/sparse_mla.py takes the top-k.
        """
        if not meta.decode_only or not self._runs_here(queries):
            return None
        keys = pool.index_storage[pool.index_row[layer]]
        tables = step_tables(meta, pool.page_size)
        self.index_score_calls += 1
        return paged_index_scores(queries, weights, keys, tables, scale)
