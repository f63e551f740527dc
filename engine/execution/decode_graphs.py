"""Decode steps replayed as CUDA graphs, one graph per batch-size bucket.

A decode step of a mid-size model is hundreds of small kernels; launched one
by one from Python the GPU waits on the host most of the step (issue 28:
about 900 launches a step, the GPU busy a quarter of the time). A graph
launches them all at once. SGLang and vLLM capture decode the same way.

What replays: a step in which every sequence decodes one token and samples it
(no speculative verification, no prompt logits), on the Triton attention
backend, on one GPU. Every other step (prefill, mixed, verification) runs
eagerly, as do steps larger than the largest bucket.

Buckets: 1, 2, 4, 8, then every 8 up to max_num_seqs; a step of n sequences
runs the smallest bucket that holds n, the rest pad rows (decode_inputs.py).
Capture is lazy: a bucket's first step runs the model twice eagerly on the
fixed buffers (Triton compiles, scale and rotary caches fill) and then
captures it; later steps of that bucket replay it. All graphs share one
memory pool, and each keeps its logits tensor, which the next replay of the
same bucket overwrites (the engine samples before it steps again).

FP8 scales reach the kernels at capture (tensors the backend caches, MLA's as
numbers), so a graph lives only as long as the pool's scale tensors are the
ones it was captured with (identity and in-place version): a change drops
every graph. Until every layer is calibrated (which happens inside the pool's
own write) steps run eagerly. A capture that fails logs a warning once and
leaves graphs off for the engine: eager steps are slower, never wrong.
"""

from __future__ import annotations

import logging

import torch

from engine.attention.triton.backend import needs_pool_write
from engine.execution.decode_inputs import DecodeInputs
from engine.models.decoder import ForwardContext
from engine.requests.sequence import ScheduledSequence

log = logging.getLogger(__name__)

WARMUP_RUNS = 2  # eager runs before a capture: compiles, lazily built caches
SCALE_NAMES = ("k_scale", "v_scale", "latent_scale", "rope_scale")


def decode_buckets(max_batch: int) -> list[int]:
    """Batch sizes that get a graph: 1, 2, 4, 8, 16, 24, ... and max_batch itself."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be positive, got {max_batch}")
    sizes = {s for s in (1, 2, 4) if s < max_batch} | set(range(8, max_batch, 8))
    return sorted(sizes | {max_batch})


def scale_key(pool) -> tuple:
    """The pool's scale tensors as a graph sees them: identity and in-place version."""
    key = []
    for name in SCALE_NAMES:
        value = getattr(pool, name, None)
        if isinstance(value, torch.Tensor):
            key.append((name, id(value), value._version))
    return tuple(key)


def pool_ready(pool) -> bool:
    """Whether every layer's write goes through the kernels (FP8 scales calibrated,
    nothing observing writes): the pool's own write cannot be captured."""
    return not any(needs_pool_write(pool, layer) for layer in range(pool.layout.num_layers))


class DecodeGraphs:
    """Decode steps on fixed buffers; captured as CUDA graphs when `capture` (on a GPU),
    else run eagerly on the same buffers (how the CPU tests check the plumbing)."""

    def __init__(self, model, pool, backend, inputs: DecodeInputs, capture: bool):
        self.model = model
        self.pool = pool
        self.backend = backend
        self.inputs = inputs
        self.capture = capture
        self.buckets = decode_buckets(inputs.max_batch)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.mempool = torch.cuda.graph_pool_handle() if capture else None
        self.disabled: str | None = None  # why graphs are off, after a failed capture
        self._scale_key: tuple = ()
        self.replays = 0  # steps served here (benchmarks report them)
        self.captures = 0

    def bucket(self, count: int) -> int:
        return next(size for size in self.buckets if size >= count)

    def takes(self, batch: list[ScheduledSequence], want_chunk_logits: set[int]) -> bool:
        """Whether this step is a plain decode step the graphs can run."""
        if self.disabled or want_chunk_logits or len(batch) > self.inputs.max_batch:
            return False
        for item in batch:
            if item.num_tokens != 1 or item.draft or not item.reaches_end:
                return False
        return pool_ready(self.pool)

    def run(self, batch: list[ScheduledSequence]) -> torch.Tensor | None:
        """Float32 logits [len(batch), vocab], or None when the step must run eagerly."""
        rows = self.bucket(len(batch))
        key = scale_key(self.pool)
        if key != self._scale_key:
            self.graphs.clear()  # captured with other scales
            self._scale_key = key
        self.inputs.fill(batch, rows)
        if not self.capture:
            self.replays += 1
            return self._step(rows)[: len(batch)]
        captured = self.graphs.get(rows)
        if captured is None:
            try:
                captured = self.graphs[rows] = self._capture(rows)
            except Exception as err:  # noqa: BLE001 - any failure means: decode eagerly
                self.disabled = f"{type(err).__name__}: {err}"
                self.graphs.clear()
                log.warning("CUDA graph capture failed; decoding eagerly: %s", self.disabled)
                return None
        graph, logits = captured
        graph.replay()
        self.replays += 1
        return logits[: len(batch)]

    def _step(self, rows: int) -> torch.Tensor:
        """The model on the fixed buffers: everything here is what a replay repeats."""
        ids, positions = self.inputs.model_inputs(rows)
        ctx = ForwardContext(pool=self.pool, meta=self.inputs.metadata(rows), backend=self.backend)
        hidden = self.model(ids, positions, ctx)
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def _capture(self, rows: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # Warm-up on a side stream, as torch's capture notes advise; it rewrites this
        # step's own K/V with the same values, and pad rows write nothing.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                self._step(rows)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads' CUDA calls during the capture (a server's KV spill
        # to the host tier, say) do not invalidate it; only this thread's must be safe.
        with torch.cuda.graph(graph, pool=self.mempool, capture_error_mode="thread_local"):
            logits = self._step(rows)
        self.captures += 1
        log.info("captured the decode step for %d sequences as a CUDA graph", rows)
        return graph, logits

    def describe(self) -> dict:
        """For /v1/engine/stats and benchmarks."""
        return {
            "cuda_graphs": "off: " + self.disabled if self.disabled else "on",
            "graph_buckets": sorted(self.graphs) if self.capture else [],
            "graph_steps": self.replays,
        }
