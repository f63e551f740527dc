"""A decode step's inputs in fixed device buffers, the form a CUDA graph can replay.

A captured graph reads the same addresses on every replay, so a decode step's
inputs live in one int32 device buffer laid out as contiguous segments

    token ids [B] | positions [B] | cache slots [B] | context lengths [B] | page tables [B, P]

for B = the largest batch bucket and P = the pages of the longest context the
pool allows. A step fills a pinned host copy of the same layout and moves it
with ONE host-to-device copy of the segments it uses; everything the model
reads (ids, positions, slots, the Triton kernels' page tables) is a view of
that buffer. Rows past the step's sequences are padding: slot -1 (the KV
write skips it), context length 0 (the decode kernels give zeros), token 0
at position 0.

The metadata built here carries only what the Triton decode path reads
(slot_mapping, decode_only and the page tables through step_tables' cache),
with `max_seq_len` set to the capacity so the kernels' split count, and with
it the launch grid, is the same on every replay of a bucket; each sequence
is split by its own length inside the kernel.
"""

from __future__ import annotations

import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.triton.common import StepTables
from engine.requests.sequence import ScheduledSequence

IDS, POSITIONS, SLOTS, LENGTHS = range(4)  # the per-row segments, in buffer order


class DecodeInputs:
    """Static device buffers for decode batches of up to `max_batch` sequences."""

    def __init__(self, max_batch: int, max_model_len: int, page_size: int, device: torch.device):
        self.max_batch = max_batch
        self.page_size = page_size
        self.capacity = max_model_len
        self.max_pages = -(-max_model_len // page_size)
        size = 4 * max_batch + max_batch * self.max_pages
        self.device_buffer = torch.zeros(size, dtype=torch.int32, device=device)
        pinned = device.type == "cuda"
        self.host_buffer = torch.zeros(size, dtype=torch.int32, pin_memory=pinned)
        self._host = self.host_buffer.numpy()  # row writes without a tensor per value
        # The last copy out of the pinned buffer; the next fill waits for it before
        # writing over its source (the sampler has synchronised by then in practice).
        self._copied = torch.cuda.Event() if pinned else None

    def _segment(self, buffer, which: int, rows: int):
        start = which * self.max_batch
        return buffer[start : start + rows]

    def _tables(self, buffer, rows: int):
        start = 4 * self.max_batch
        return buffer[start : start + rows * self.max_pages].view(rows, self.max_pages)

    def fill(self, batch: list[ScheduledSequence], rows: int) -> None:
        """Write one decode step (one token per sequence) and pad up to `rows`; one copy."""
        host, b = self._host, self.max_batch
        count = len(batch)
        if self._copied is not None:
            self._copied.synchronize()
        if count > rows or rows > b:
            raise ValueError(f"{count} sequences do not fit a bucket of {rows} (at most {b})")
        tables = host[4 * b :].reshape(b, self.max_pages)
        for row, item in enumerate(batch):
            seq = item.seq
            position = seq.num_computed_tokens
            pages = seq.pages
            used = position // self.page_size + 1
            # A decode step feeds the last token (token_ids would copy the whole list).
            host[IDS * b + row] = (seq.output_token_ids or seq.prompt_token_ids)[-1]
            host[POSITIONS * b + row] = position
            host[SLOTS * b + row] = pages[position // self.page_size] * self.page_size + (
                position % self.page_size
            )
            host[LENGTHS * b + row] = position + 1
            tables[row, :used] = pages[:used]
        # Pad rows' tables are never read (length 0), so they are left as they were.
        for which, pad in ((IDS, 0), (POSITIONS, 0), (SLOTS, -1), (LENGTHS, 0)):
            host[which * b + count : which * b + rows] = pad
        used = 4 * b + rows * self.max_pages
        self.device_buffer[:used].copy_(self.host_buffer[:used], non_blocking=True)
        if self._copied is not None:
            self._copied.record()

    def model_inputs(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(token ids, positions) as int64 views' copies: made inside the captured step."""
        ids = self._segment(self.device_buffer, IDS, rows).long()
        positions = self._segment(self.device_buffer, POSITIONS, rows).long()
        return ids, positions

    def metadata(self, rows: int) -> AttentionMetadata:
        """What the Triton decode path reads for a bucket of `rows`, as views of the buffer."""
        device = self.device_buffer.device
        lengths = self._segment(self.device_buffer, LENGTHS, rows)
        meta = AttentionMetadata(
            slot_mapping=self._segment(self.device_buffer, SLOTS, rows).long(),
            query_index=torch.arange(rows, device=device).view(rows, 1),
            output_index=torch.arange(rows, device=device),
            # No per-token context slots: the kernels read the page tables. An empty grid
            # makes any path that would read slots fail loudly rather than read stale ones.
            context_slots=torch.zeros(rows, 0, dtype=torch.long, device=device),
            query_positions=torch.zeros(rows, 1, dtype=torch.long),
            is_causal_single=False,
            query_lens=[1] * rows,
            context_lens=[self.capacity] * rows,
            decode_only=True,
        )
        meta._triton_tables = StepTables(
            page_size=self.page_size,
            block_tables=self._tables(self.device_buffer, rows),
            seq_lens=lengths,
            query_lens=torch.ones(rows, dtype=torch.int32, device=device),
            query_starts=torch.arange(rows, dtype=torch.int32, device=device),
            max_seq_len=self.capacity,
            max_query_len=1,
        )
        return meta
