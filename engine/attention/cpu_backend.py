"""The CPU attention backend: the torch backend, with attention in C kernels.

A decode step has one query per sequence over its whole cached context. The
torch path gathers every context slot into a dense tensor, converts it (FP8
bytes through a bit trick, then to float32) and runs two batched products;
at 16 sequences that is most of a step's non-GEMM time. The kernel
(engine/cpu_kernels/paged_decode.c) reads K and V rows in place from the
pages and does the same arithmetic in float32; new K/V go into the pages in one
call too (kv_write.c, FP8 bytes equal to the pool's own write).

Prefill and mixed steps with BF16 queries go to paged_prefill.c on CPUs with
AVX-512 BF16: causal attention in BF16 dot products over the pages, about 2.5x
torch's SDPA on this work (which must take an explicit mask as soon as a chunk
sits over a cached prefix). Float32 queries and layouts the kernels do not
take stay on the torch path.

MLA decode steps (engine/attention/mla.py calls `mla_decode`) go to
mla_decode.c: the absorbed path in one call, where torch spends ~5 ms a Kimi
layer in SDPA and two einsums at shapes too small for them. MLA prefill
stays on the torch paths.
"""

from __future__ import annotations

from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import TorchAttentionBackend
from engine.cpu_kernels import mla_decode as mla_kernel
from engine.cpu_kernels.paged_decode import kv_write, paged_decode, supports
from engine.cpu_kernels.paged_prefill import paged_prefill, prefill_supports


class CPUAttentionBackend(TorchAttentionBackend):
    name = "cpu"
    # mla_decode attends over each sequence's meta.context_slots[:length], whatever
    # slots they are: DSA hands it only the selected ones (engine/attention/sparse_mla.py).
    mla_decode_reads_context_slots = True

    def forward(self, layer, q, k, v, pool, meta: AttentionMetadata, softmax_scale: float):
        storage = getattr(pool, "storage", None)
        if (
            meta.decode_only
            or storage is None
            or not hasattr(pool, "head_factors")
            or not prefill_supports(q, storage[layer])
        ):
            return super().forward(layer, q, k, v, pool, meta, softmax_scale)
        self.write(layer, k, v, pool, meta)
        k_factor, v_factor = pool.head_factors(layer)
        return paged_prefill(
            q,
            storage[layer],
            meta.context_slots,
            meta.context_lengths(),
            meta.query_lens,
            k_factor,
            v_factor,
            softmax_scale,
        )

    def write(self, layer, k, v, pool, meta: AttentionMetadata) -> None:
        """New K/V into the pages in one C call (FP8: the same bytes as the pool's write)."""
        write_scales = getattr(pool, "write_scales", None)
        scales = write_scales(layer) if write_scales is not None else None
        storage = getattr(pool, "storage", None)
        if (
            scales is None
            or k.device.type != "cpu"
            or not supports(storage[layer], k.shape[-1])
            or not kv_write(k, v, meta.slot_mapping, storage[layer], *scales)
        ):
            pool.write(layer, k, v, meta.slot_mapping)

    def _decode(self, layer, q, pool, meta: AttentionMetadata, softmax_scale: float):
        storage = getattr(pool, "storage", None)
        head_factors = getattr(pool, "head_factors", None)
        if (
            storage is None
            or head_factors is None
            or q.device.type != "cpu"
            or not supports(storage[layer], q.shape[-1])
        ):
            return super()._decode(layer, q, pool, meta, softmax_scale)
        k_factor, v_factor = head_factors(layer)
        return paged_decode(
            q,
            storage[layer],
            meta.context_slots,
            meta.context_lengths(),
            k_factor,
            v_factor,
            softmax_scale,
        )

    def mla_decode(
        self,
        layer,
        q_nope,
        q_rope,
        latent,
        k_rope,
        kv_b_weight,
        pool,
        meta,
        dims,
        softmax_scale,
        latent_grid=None,
    ):
        """Absorbed MLA for a decode step -> [B, H, v_dim] (one token a sequence: the order
        mla_attention returns); None leaves the step to torch. Shapes as mla_attention's;
        `latent_grid` (a LatentGrid): W_UK and W_UV read from grid weights instead."""
        storage = getattr(pool, "storage", None)
        dequant_factors = getattr(pool, "dequant_factors", None)
        if not meta.decode_only or storage is None or dequant_factors is None:
            return None
        grid = latent_grid is not None and latent_grid.fits(
            dims.num_heads, dims.nope_dim, dims.v_dim, dims.lora_rank
        )
        if not mla_kernel.supports(q_nope, q_rope, None if grid else kv_b_weight, storage[layer]):
            return None
        # The pool's own write: it calibrates FP8 scales on a layer's first write, and
        # the factors are read after it.
        pool.write(layer, latent, k_rope, meta.slot_mapping)
        args = (storage[layer], meta.context_slots, meta.context_lengths())
        factors = (*dequant_factors(layer), softmax_scale)
        if grid:
            return mla_kernel.mla_decode_grid(q_nope, q_rope, latent_grid, *args, *factors)
        return mla_kernel.mla_decode(q_nope, q_rope, kv_b_weight, *args, *factors)
