"""Builds one step's batch tensors from scheduled sequences and runs the model.

The runner knows tensors, not policy: the scheduler decides who runs and how
many tokens; the runner lays those tokens out flat, computes slots from page
tables, and returns the logits rows the engine asked for. `build_runner`
decides how it runs: the attention backend, and whether decode steps replay
as CUDA graphs (decode_graphs.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.registry import get_backend
from engine.config import EngineConfig
from engine.execution.slot_tables import SlotTables
from engine.kv.state_pool import RecurrentStatePool, StepStates
from engine.models.decoder import ForwardContext
from engine.requests.sequence import ScheduledSequence


@dataclass
class StepOutput:
    # Logits at each sampling row: [len(sample_rows), vocab], float32.
    sample_logits: torch.Tensor
    sample_rows: list[int]  # indices into the scheduled list that sample a token
    # Per scheduled index: logits of every token in its chunk, when it asked for them.
    chunk_logits: dict[int, torch.Tensor]
    # Per scheduled index with a draft: logits of each of its 1 + len(draft) rows.
    verify_logits: dict[int, torch.Tensor] = field(default_factory=dict)
    # Every row's final hidden state (the lm_head's input), when the runner keeps them
    # (`keep_hidden`: an MTP draft reads them, engine/speculative/mtp_proposer.py).
    hidden: torch.Tensor | None = None


class ModelRunner:
    def __init__(
        self,
        model,
        pool,
        backend,
        page_size: int,
        device: torch.device,
        verify_as_rows: bool | None = None,
        state_pool: RecurrentStatePool | None = None,
        snapshot_pool: RecurrentStatePool | None = None,
    ):
        self.model = model
        self.pool = pool
        # A hybrid model's per-sequence recurrent states (engine/kv/state_pool.py), else None,
        # and the prefix cache's snapshots of them (None without prefix caching).
        self.state_pool = state_pool
        self.snapshot_pool = snapshot_pool
        self.backend = backend
        self.page_size = page_size
        self.slot_tables = SlotTables(page_size)
        self.device = device
        # How a speculative verification of [last, d1..dk] is laid out. As rows: k+1
        # one-query "sequences" sharing one page table, row j seeing the context up to
        # its own position; every backend writes a step's K/V before it attends, so row
        # j sees the drafts before it, and the step stays a decode step (on the CPU the
        # fused decode kernel, whose cost hardly grows with rows, and the same
        # arithmetic per row as plain decoding). As one extend of k+1 queries: attention
        # reads the context once, not k+1 times, which is what a GPU with a long
        # context wants (the prefill kernels take several queries over a cached prefix).
        self.verify_as_rows = device.type == "cpu" if verify_as_rows is None else verify_as_rows
        # Plain decode steps on fixed buffers, replayed as CUDA graphs (decode_graphs.py);
        # set by build_runner where they run.
        self.graphs = None
        # Return each step's hidden states (StepOutput.hidden); decode steps then run
        # eagerly, as a captured graph returns logits only.
        self.keep_hidden = False

    @torch.inference_mode()
    def run(self, batch: list[ScheduledSequence], want_chunk_logits: set[int]) -> StepOutput:
        if (
            self.graphs is not None
            and not self.keep_hidden
            and self.graphs.takes(batch, want_chunk_logits)
        ):
            logits = self.graphs.run(batch)
            if logits is not None:
                return StepOutput(logits, list(range(len(batch))), {})
        input_ids: list[int] = []
        positions: list[torch.Tensor] = []
        slot_mapping: list[torch.Tensor] = []
        context_slots: list[torch.Tensor] = []
        query_lens: list[int] = []
        context_lens: list[int] = []
        last_rows: list[int] = []
        sample_rows: list[int] = []
        chunk_ranges: dict[int, tuple[int, int]] = {}
        verify_rows: list[int] = []
        verify_ranges: dict[int, tuple[int, int]] = {}  # index -> (first of verify_rows, count)
        offset = 0
        for index, item in enumerate(batch):
            seq, n = item.seq, item.num_tokens
            start = seq.num_computed_tokens
            end = start + n
            input_ids.extend(item.token_ids())
            positions.append(torch.arange(start, end))
            slots = self.slot_tables.slots(getattr(seq, "request_id", None), seq.pages, end)
            slot_mapping.append(slots[start:end])
            if item.draft and self.verify_as_rows:
                for row_end in range(start + 1, end + 1):
                    context_slots.append(slots[:row_end])
                    query_lens.append(1)
                    context_lens.append(row_end)
            else:
                context_slots.append(slots)
                query_lens.append(n)
                context_lens.append(end)
            if item.draft:
                verify_ranges[index] = (len(verify_rows), n)
                verify_rows.extend(range(offset, offset + n))
            elif item.reaches_end:
                sample_rows.append(index)
                last_rows.append(offset + n - 1)
            if index in want_chunk_logits:
                chunk_ranges[index] = (offset, offset + n)
            offset += n
        self.slot_tables.keep_only({getattr(item.seq, "request_id", None) for item in batch})
        meta = AttentionMetadata.build(
            query_lens, context_lens, torch.cat(slot_mapping), context_slots, self.device
        )
        ctx = ForwardContext(pool=self.pool, meta=meta, backend=self.backend)
        if self.state_pool is not None:
            ctx.states = StepStates.for_batch(self.state_pool, batch, self.snapshot_pool)
        ids = torch.tensor(input_ids, dtype=torch.long, device=self.device)
        pos = torch.cat(positions).to(self.device)
        hidden = self.model(ids, pos, ctx)
        if ctx.states is not None:
            ctx.states.keep_snapshots()  # the states at the ends of this step's chunks
        # Sampling rows, then verification rows: one product through the LM head.
        all_rows = last_rows + verify_rows
        rows_count = hidden.shape[0]
        if len(all_rows) == rows_count and all_rows == list(range(rows_count)):
            picked = hidden  # a decode step's rows, in order: no gather
        else:
            picked = hidden[torch.tensor(all_rows, dtype=torch.long, device=self.device)]
        logits = self.model.compute_logits(picked) if all_rows else hidden.new_empty(0)
        first = len(last_rows)
        verify_logits = {
            index: logits[first + a : first + a + n] for index, (a, n) in verify_ranges.items()
        }
        sample_logits = logits[:first] if verify_ranges else logits
        chunk_logits = {
            index: self.model.compute_logits(hidden[a:b]) for index, (a, b) in chunk_ranges.items()
        }
        kept = hidden if self.keep_hidden else None
        return StepOutput(sample_logits, sample_rows, chunk_logits, verify_logits, kept)


def build_runner(
    model,
    pool,
    config: EngineConfig,
    device: torch.device,
    ranks: int,
    max_model_len: int,
    state_pool: RecurrentStatePool | None = None,
    snapshot_pool: RecurrentStatePool | None = None,
) -> ModelRunner:
    """The runner over `config`'s attention backend, with CUDA graphs where they run."""
    runner = ModelRunner(
        model,
        pool,
        get_backend(config.attention_backend, config.deterministic),
        config.page_size,
        device,
        state_pool=state_pool,
        snapshot_pool=snapshot_pool,
    )
    if not config.fp8_decode_dots and hasattr(runner.backend, "fp8_dot"):
        runner.backend.fp8_dot = False  # the Triton backend's default takes them where it can
    if config.cuda_graphs and ranks == 1 and graphs_can_run(runner):
        # Here, not at the top: the graphs' inputs are the Triton kernels' page tables,
        # and Triton is installed only where it runs (Linux x86-64).
        from engine.execution.decode_graphs import DecodeGraphs
        from engine.execution.decode_inputs import DecodeInputs

        runner.graphs = DecodeGraphs(
            model,
            pool,
            runner.backend,
            DecodeInputs(config.max_num_seqs, max_model_len, config.page_size, device),
            capture=True,
        )
    return runner


def graphs_can_run(runner: ModelRunner) -> bool:
    """CUDA graphs replay decode on a GPU whose attention is the Triton backend (the
    torch and deterministic backends build masks and tables on the host each step),
    for models without recurrent state (the graphs' inputs carry no state slots) and
    whose decode step is the same work at every length (not DSA's, which turns sparse
    past its top-k: engine/models/deepseek_v32.py)."""
    return (
        runner.device.type == "cuda"
        and runner.backend.name == "triton"
        and runner.state_pool is None
        and getattr(runner.model, "supports_decode_graphs", True)
    )
