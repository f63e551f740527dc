"""The recurrent states of a hybrid model's running sequences, beside the paged KV pool.

One slot per sequence that may run at once (max_num_seqs), each holding, for
every linear-attention layer, the short-convolution state [W-1, channels] (in
the activations' dtype, the inputs it remembers) and the delta-rule state
[heads, key_dim, value_dim] (float32). Which sequence holds which slot is the
scheduler's business (engine/kv/state_slots.py); what a step reads and writes
is described by `StepStates`, built by the runner from the scheduled batch.

Invariant: at the start of a step, a sequence's slot holds its state after
its `num_computed_tokens` tokens. A sequence that starts from its first token
(new, or preempted and recomputed) gets its slot zeroed first, so chunked
prefill, decode and recompute all continue from exactly what came before; one
that starts after a cached prefix gets the prefix cache's snapshot of the state
there copied in first (`ScheduledSequence.load_snapshot`). A chunk the
scheduler marked (`save_snapshot`) leaves a copy of the state at its end in a
snapshot entry after the step (`keep_snapshots`). Snapshot entries are a
second pool of this class (engine/kv/prefix_snapshots.py says who holds them);
every load of a step runs before its forward pass and every save after it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from engine.kv.recurrent_state import RecurrentStateLayout

log = logging.getLogger(__name__)


class RecurrentStatePool:
    def __init__(
        self,
        layout: RecurrentStateLayout,
        num_slots: int,
        conv_dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ):
        self.layout = layout
        self.num_slots = num_slots
        self.conv_dtype = conv_dtype
        lay = layout
        self.conv = torch.zeros(
            lay.num_layers,
            num_slots,
            lay.conv_width - 1,
            lay.conv_channels,
            dtype=conv_dtype,
            device=device,
        )
        self.recurrent = torch.zeros(
            lay.num_layers,
            num_slots,
            lay.num_heads,
            lay.key_dim,
            lay.value_dim,
            dtype=torch.float32,
            device=device,
        )

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.recurrent.nbytes

    @staticmethod
    def bytes_for(layout: RecurrentStateLayout, num_slots: int, conv_dtype: torch.dtype) -> int:
        """What a pool of `num_slots` takes, before allocating it (the KV budget's share)."""
        return num_slots * layout.bytes_per_sequence(conv_dtype.itemsize)

    def copy_from(self, source: RecurrentStatePool, src: list[int], dst: list[int]) -> None:
        """Slots `dst` of this pool become `source`'s slots `src` (snapshots in and out)."""
        if src:
            device = self.conv.device
            src_index = torch.tensor(src, dtype=torch.long, device=device)
            dst_index = torch.tensor(dst, dtype=torch.long, device=device)
            self.conv[:, dst_index] = source.conv[:, src_index]
            self.recurrent[:, dst_index] = source.recurrent[:, src_index]

    def slot_bytes(self, slot: int) -> bytes:
        """The stored bytes of one slot over all layers (what the prefix tiers carry)."""
        parts = (self.conv[:, slot], self.recurrent[:, slot])
        return b"".join(p.contiguous().view(torch.uint8).cpu().numpy().tobytes() for p in parts)

    def load_slot_bytes(self, slot: int, data: bytes) -> None:
        """Put back what `slot_bytes` returned, byte for byte."""
        targets = (self.conv[:, slot], self.recurrent[:, slot])
        sizes = [t.numel() * t.element_size() for t in targets]
        if len(data) != sum(sizes):
            raise ValueError(f"a recurrent state holds {sum(sizes)} bytes, not {len(data)}")
        offset = 0
        for target, size in zip(targets, sizes, strict=True):
            raw = torch.frombuffer(bytearray(data[offset : offset + size]), dtype=torch.uint8)
            target.copy_(raw.view(target.dtype).view(target.shape).to(target.device))
            offset += size

    def reset(self, slots: list[int]) -> None:
        """Zero these slots: their sequences start from their first token this step."""
        if slots:
            index = torch.tensor(slots, dtype=torch.long, device=self.conv.device)
            self.conv[:, index] = 0
            self.recurrent[:, index] = 0


@dataclass
class StepStates:
    """The recurrent states one forward step reads and writes: each scheduled sequence's
    slot and its token count, in the order the runner lays their tokens out."""

    pool: RecurrentStatePool
    slots: list[int]
    query_lens: list[int]
    _decode_rows: tuple[torch.Tensor, torch.Tensor] | None = None
    snapshots: RecurrentStatePool | None = None
    saves: list[tuple[int, int]] = field(default_factory=list)  # (slot, snapshot entry)

    @classmethod
    def for_batch(
        cls, pool: RecurrentStatePool, batch, snapshots: RecurrentStatePool | None = None
    ) -> StepStates:
        """Slots of the scheduled sequences; zeroes those starting from their first token
        and loads the snapshot of those starting after a cached prefix."""
        slots, query_lens, fresh, loads, saves = [], [], [], [], []
        for item in batch:
            seq = item.seq
            slot = getattr(seq, "state_slot", None)
            if slot is None:
                raise RuntimeError("a sequence of a model with recurrent state holds no slot")
            if item.draft:
                # A rejected draft token would stay folded into the state.
                raise RuntimeError("speculative drafts cannot run on a recurrent state")
            slots.append(slot)
            query_lens.append(item.num_tokens)
            # Rank 0's ScheduledSequence or a worker's WorkerItem (engine/distributed/step.py).
            load = getattr(item, "load_snapshot", None)
            save = getattr(item, "save_snapshot", None)
            if seq.num_computed_tokens == 0:
                fresh.append(slot)
            elif load is not None:
                loads.append((load, slot))
            if save is not None:
                saves.append((slot, save))
        pool.reset(fresh)
        if loads or saves:
            if snapshots is None:
                raise RuntimeError("a step moves recurrent-state snapshots but none are kept")
            pool.copy_from(snapshots, [e for e, _ in loads], [s for _, s in loads])
        return cls(pool, slots, query_lens, snapshots=snapshots, saves=saves)

    def keep_snapshots(self) -> None:
        """After the forward pass: copy the states the scheduler asked to keep."""
        if self.saves:
            assert self.snapshots is not None
            self.snapshots.copy_from(
                self.pool, [s for s, _ in self.saves], [e for _, e in self.saves]
            )

    def decode_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(flat token index, slot) of the sequences with one token this step, which
        run the recurrence together; built once per step, shared by the layers."""
        if self._decode_rows is None:
            tokens, slots, offset = [], [], 0
            for slot, n in zip(self.slots, self.query_lens, strict=True):
                if n == 1:
                    tokens.append(offset)
                    slots.append(slot)
                offset += n
            device = self.pool.conv.device
            self._decode_rows = (
                torch.tensor(tokens, dtype=torch.long, device=device),
                torch.tensor(slots, dtype=torch.long, device=device),
            )
        return self._decode_rows

    def prefill_runs(self) -> list[tuple[int, int, int]]:
        """(first flat token, token count, slot) of each sequence with several tokens."""
        runs, offset = [], 0
        for slot, n in zip(self.slots, self.query_lens, strict=True):
            if n > 1:
                runs.append((offset, n, slot))
            offset += n
        return runs


def state_layout_of(model) -> RecurrentStateLayout | None:
    """The model's per-sequence recurrent state, or None for a model with KV alone."""
    declare = getattr(model, "recurrent_state_layout", None)
    return declare() if declare is not None else None


def allocate_state_pool(
    layout: RecurrentStateLayout,
    num_slots: int,
    conv_dtype: torch.dtype,
    device: torch.device,
    purpose: str = "recurrent states",
) -> RecurrentStatePool:
    pool = RecurrentStatePool(layout, num_slots, conv_dtype, device)
    log.info(
        "%s: %d slots of %d bytes (%d linear-attention layers), %.3f GiB",
        purpose,
        num_slots,
        layout.bytes_per_sequence(conv_dtype.itemsize),
        layout.num_layers,
        pool.nbytes / 1024**3,
    )
    return pool
