"""LLMEngine: requests in, one scheduled forward step at a time, outputs out.

This is the synchronous core. `LLM` drives it to completion for a list of
prompts; the serving layer's async engine drives the same `step()` in a loop.
The stages of a request each have their own file, as vLLM v1 cuts them:

- set-up: engine_parts.py builds every part once (prefix_tiers.py the prefix
  cache and its tiers, worker_ranks.py the other tensor-parallel ranks);
- intake: intake.py encodes and checks a prompt and builds its Sequence;
- the step: here;
- outputs: output_processor.py appends tokens, decides stops, detokenizes and
  builds RequestOutputs (draft_acceptance.py for a verified draft);
- stats: engine_stats.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.config import EngineConfig
from engine.core.draft_acceptance import accept_draft
from engine.core.engine_attributes import EngineAttributes
from engine.core.engine_parts import assemble_engine
from engine.core.engine_stats import engine_load, engine_stats
from engine.core.intake import RequestIntake
from engine.core.output_processor import OutputProcessor
from engine.errors import WorkerDiedError
from engine.requests.outputs import RequestOutput
from engine.requests.params import SamplingParams
from engine.requests.sequence import ScheduledSequence, Sequence

if TYPE_CHECKING:
    import torch


class LLMEngine(EngineAttributes):
    def __init__(self, config: EngineConfig):
        self.parts = assemble_engine(config)
        parts, rank = self.parts, self.parts.rank
        self.intake = RequestIntake(
            parts.tokenizer, rank.model_config, rank.max_model_len, parts.eos_token_ids
        )
        self.output_processor = OutputProcessor(
            parts.scheduler, parts.eos_token_ids, rank.max_model_len
        )

    # ----- requests ---------------------------------------------------------------
    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        max_chunk: int | None = None,
        collect_logits: bool = False,
        cache_salt: str = "",
    ) -> Sequence:
        if self.executor.failure is not None:
            raise WorkerDiedError(self.executor.failure)
        seq = self.intake.sequence(
            prompt, params or SamplingParams(), request_id, max_chunk, collect_logits, cache_salt
        )
        self.scheduler.add(seq)  # a full queue refuses it before it is kept
        self.intake.keep(seq)
        return seq

    def abort(self, request_id: str) -> None:
        """Stop a request and free its pages at once (a client went away)."""
        seq = self.intake.release(request_id)
        if seq is not None and not seq.is_finished:
            self.scheduler.finish(seq, "abort")

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        return self.intake.encode(prompt)

    # ----- the step -----------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run the batch, sample; the outputs of every request that moved."""
        scheduler, outputs_of = self.scheduler, self.output_processor
        batch = scheduler.schedule()
        outputs = [outputs_of.make_output(seq) for seq in scheduler.failed]
        if batch:
            want = {i for i, item in enumerate(batch) if outputs_of.wants_chunk_logits(item)}
            out = self.executor.run(batch, want)
            for index, logits in out.chunk_logits.items():
                outputs_of.record_prompt_logits(batch[index], logits)
            sampled = {}
            if out.sample_rows:
                seqs = [batch[i].seq for i in out.sample_rows]
                picks = self.sampler.sample(out.sample_logits, seqs)
                sampled = dict(zip(out.sample_rows, picks, strict=True))
            for index, item in enumerate(batch):
                seq = item.seq
                if item.draft:
                    self._accept_draft(item, out.verify_logits[index])
                    outputs.append(outputs_of.make_output(seq))
                    continue
                seq.num_computed_tokens += item.num_tokens
                if item.num_tokens > 1 or item.save_snapshot is not None:
                    scheduler.cache(seq, item.save_snapshot)  # share a prefill (and state)
                if index in sampled:
                    token, info = sampled[index]
                    outputs_of.append_token(seq, token, info)
                    outputs.append(outputs_of.make_output(seq))
            self.speculator.after_step(batch, out.hidden)  # MTP drafts from the new tokens
        self.intake.release_finished(outputs)
        return outputs

    def _accept_draft(self, item: ScheduledSequence, logits: torch.Tensor) -> None:
        accept_draft(
            item,
            logits,
            default_generator=self.sampler.generator,
            scheduler=self.scheduler,
            speculator=self.speculator,
            outputs=self.output_processor,
        )

    # ----- prefix pinning, the disk tier, flushing, statistics -------------------------
    def pin_prefix(self, token_ids: list[int], cache_salt: str = "") -> list:
        """Protect this prefix's cached pages from eviction; the handle is for unpin
        (engine/core/prefix_tiers.py)."""
        return self.parts.prefix.pin(token_ids, cache_salt)

    def unpin_prefix(self, handle: list) -> None:
        self.parts.prefix.unpin(handle)

    def save_prefix(self, token_ids: list[int], cache_salt: str = "") -> int:
        """Write this prefix's cached pages to the disk tier; returns pages newly written."""
        return self.parts.prefix.save(token_ids, cache_salt)

    def restore_prefix(self, token_ids: list[int], cache_salt: str = "") -> int:
        """Load this prefix's saved pages into the prefix cache; returns tokens restored."""
        return self.parts.prefix.restore(token_ids, cache_salt)

    def flush_prefix_cache(self) -> dict[str, int]:
        """Forget every cached prefix, in memory and in the tiers; what went and what
        stayed (engine/core/prefix_tiers.py)."""
        return self.parts.prefix.flush()

    def stats(self) -> dict:
        return engine_stats(self.parts)

    def load(self) -> dict:
        """Requests running and waiting and KV use, cheaply (engine_stats.py)."""
        return engine_load(self.parts)

    def kv_event_sources(self) -> dict:
        return self.parts.prefix.kv_event_sources()

    # ----- failure and shutdown -------------------------------------------------------
    @property
    def failure(self) -> str | None:
        """Why the engine can no longer step (a tensor-parallel rank died), or None."""
        return self.executor.failure

    def on_failure(self, callback: Callable[[str], None]) -> None:
        """Call `callback(message)`, from any thread, if the engine fails."""
        self.executor.on_failure(callback)

    def close(self) -> None:
        """Stop the worker ranks, if any (by PID, after a shutdown message)."""
        self.parts.close()
