"""LLMEngine: requests in, one scheduled forward step at a time, outputs out.

This is the synchronous core. `LLM` drives it to completion for a list of
prompts; the serving layer's async engine drives the same `step()` in a loop.
"""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.core.scheduler import Scheduler
from engine.distributed.executor import make_executor
from engine.distributed.launch import abandon_ranks, check_no_rank_here, start_ranks
from engine.errors import EngineError, PromptTooLongError, WorkerDiedError
from engine.execution.model_stack import build_model_stack
from engine.host.cpu_features import describe_cpu
from engine.host.threads import fit_to_usable_cores
from engine.kv.pages import PageAllocator
from engine.kv.prefix_spill import open_prefix_spill
from engine.kv.prefix_store import open_prefix_store
from engine.kv.radix import RadixCache
from engine.kv.scales import scales_in_force
from engine.kv.sizing import kv_bytes_per_token
from engine.layers.cpu_matrix_path import describe_matrix_path
from engine.layers.linear_methods import describe_methods, model_weight_bytes
from engine.model_files.store import resolve_model
from engine.requests.outputs import CompletionOutput, RequestOutput
from engine.requests.params import SamplingParams
from engine.requests.sequence import ScheduledSequence, Sequence, TokenLogprob
from engine.sampling.sampler import Sampler, token_logprobs
from engine.speculative import Speculator
from engine.speculative.verifier import SampledTargets, accept_prefix, greedy_targets
from engine.tokenizers.detokenizer import IncrementalDetokenizer
from engine.tokenizers.loading import load_tokenizer

log = logging.getLogger(__name__)
GIB = 1024**3


def _eos_ids(model_dir: Path, tokenizer) -> set[int]:
    ids: set[int] = set()
    gen_config = model_dir / "generation_config.json"
    if gen_config.is_file():
        value = json.loads(gen_config.read_text()).get("eos_token_id")
        ids.update(value if isinstance(value, list) else [value] if value is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.model_dir = resolve_model(config.model)
        self.device = torch.device(
            config.device or ("cuda" if torch.cuda.is_available() else "cpu")
        )
        self.tokenizer = load_tokenizer(self.model_dir)
        self.tensor_parallel = config.tensor_parallel_size > 1
        check_no_rank_here(self.tensor_parallel)
        self._threads_before = torch.get_num_threads()
        if self.device.type == "cpu" and not self.tensor_parallel:
            threads = fit_to_usable_cores()  # ranks split the cores themselves (start_ranks)
            log.info(
                "CPU matrix instructions: %s; %d compute threads; grid weights: %s",
                describe_cpu()["cpu_matrix_isa"],
                threads,
                describe_matrix_path()["cpu_prefill_path"],
            )
        # Rank 0 starts the other ranks first, so they load their shards meanwhile.
        workers = self._start_ranks() if self.tensor_parallel else None
        try:
            stack = build_model_stack(config, self.model_dir, self.device)
        except BaseException as err:
            if workers is None:
                raise
            torch.set_num_threads(self._threads_before)
            raise abandon_ranks(workers, err) from err
        self.executor = make_executor(stack.runner, config, workers)
        try:
            self._set_up(config, stack)
        except BaseException:
            self.close()
            raise

    def _set_up(self, config: EngineConfig, stack) -> None:
        """Everything rank 0 alone holds: scheduler, prefix cache, sampler, requests."""
        self.model, self.model_config = stack.model, stack.model_config
        self.dtype, self.kv_dtype = stack.dtype, stack.kv_dtype
        self.max_model_len = stack.max_model_len
        self.layout = stack.layout
        self.kv_rotation, self.kv_rotation_detail = stack.kv_rotation, stack.kv_rotation_detail
        self.kv_scales_file = stack.kv_scales_file
        self.cpu_kernel = stack.cpu_kernel
        # Counted once: parameters do not change after load.
        self.weight_bytes = model_weight_bytes(self.model)
        self.linear_methods = describe_methods(self.model)
        log.info(
            "weights held: %.3f GiB on this rank; linear layers: %s",
            self.weight_bytes / GIB,
            ", ".join(f"{n} {name}" for name, n in sorted(self.linear_methods.items())),
        )
        self.pool, self.runner = stack.pool, stack.runner
        self.allocator = PageAllocator(self.pool.num_pages)
        self.prefix_cache = (
            RadixCache(
                self.allocator,
                config.page_size,
                page_bytes=self.pool.page_bytes,
                verify=config.verify_prefix_cache,
            )
            if config.enable_prefix_caching
            else None
        )
        self.speculator = Speculator(
            config.speculative, config.speculative_max_draft, self.max_model_len
        )
        self.scheduler = Scheduler(
            self.allocator,
            config.page_size,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            prefix_cache=self.prefix_cache,
            max_waiting=config.max_waiting,
            speculator=self.speculator,
        )
        self.prefix_store = open_prefix_store(self)  # the disk tier, or None
        self.prefix_spill = open_prefix_spill(self)  # pinned pages giving way, and back
        self.sampler = Sampler(config.seed)
        self.eos_token_ids = _eos_ids(self.model_dir, self.tokenizer)
        self._requests: dict[str, Sequence] = {}
        self._ids = itertools.count()

    # ----- set-up and shutdown ---------------------------------------------------
    def _start_ranks(self) -> list:
        if self.config.node_rank != 0:
            raise EngineError(
                f"node_rank {self.config.node_rank} runs workers only (engine.distributed."
                "launch.run_node, or `resident serve --node-rank`); the engine is node 0"
            )
        try:
            return start_ranks(self.config, self.model_dir, self.device)
        except BaseException:
            torch.set_num_threads(self._threads_before)
            raise

    @property
    def failure(self) -> str | None:
        """Why the engine can no longer step (a tensor-parallel rank died), or None."""
        return self.executor.failure

    def on_failure(self, callback) -> None:
        """Call `callback(message)`, from any thread, if the engine fails."""
        self.executor.on_failure(callback)

    def close(self) -> None:
        """Stop the worker ranks, if any (by PID, after a shutdown message)."""
        executor = getattr(self, "executor", None)
        if executor is not None and self.tensor_parallel:
            executor.close()
            torch.set_num_threads(self._threads_before)

    @property
    def capacity_tokens(self) -> int:
        return self.pool.capacity_tokens

    # ----- requests -----------------------------------------------------------
    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        ids = [int(t) for t in prompt]
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise EngineError(f"token ids {bad[:5]} are outside the vocabulary (0..{vocab - 1})")
        return ids

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
        params = params or SamplingParams()
        ids = self.encode_prompt(prompt)
        if not ids:
            raise EngineError("the prompt is empty; give at least one token")
        if len(ids) >= self.max_model_len:
            raise PromptTooLongError(
                f"the prompt has {len(ids)} tokens but the context holds {self.max_model_len} "
                "(prompt plus at least one generated token); shorten the prompt"
            )
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._requests:
            raise EngineError(f"request id {request_id!r} is already in use")
        seq = Sequence(
            request_id=request_id,
            prompt_token_ids=ids,
            params=params,
            prompt_text=prompt if isinstance(prompt, str) else None,
            max_chunk=max_chunk,
            collect_logits=collect_logits,
            cache_salt=cache_salt,
            detok=IncrementalDetokenizer(self.tokenizer, ids, params.skip_special_tokens),
        )
        if params.seed is not None:
            seq.generator = torch.Generator().manual_seed(params.seed)
        if params.structured is not None:
            from engine.grammar.backend import request_grammar  # xgrammar only when used

            seq.grammar = request_grammar(self, params)
        self.scheduler.add(seq)
        self._requests[request_id] = seq
        return seq

    def abort(self, request_id: str) -> None:
        """Stop a request and free its pages at once (a client went away)."""
        seq = self._requests.pop(request_id, None)
        if seq is not None and not seq.is_finished:
            self.scheduler.finish(seq, "abort")

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ----- stepping -----------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        failed = [self._make_output(seq) for seq in self.scheduler.failed]
        if not batch:
            return failed
        want = {i for i, item in enumerate(batch) if self._wants_chunk_logits(item)}
        out = self.executor.run(batch, want)
        for index, logits in out.chunk_logits.items():
            self._record_prompt_logits(batch[index], logits)
        sampled = {}
        if out.sample_rows:
            seqs = [batch[i].seq for i in out.sample_rows]
            sampled = dict(
                zip(out.sample_rows, self.sampler.sample(out.sample_logits, seqs), strict=True)
            )
        outputs = []
        for index, item in enumerate(batch):
            seq = item.seq
            if item.draft:
                self._accept_draft(item, out.verify_logits[index])
                outputs.append(self._make_output(seq))
                continue
            seq.num_computed_tokens += item.num_tokens
            if item.num_tokens > 1:
                self.scheduler.cache(seq)  # share a prefill with requests arriving meanwhile
            if index in sampled:
                token, info = sampled[index]
                self._append_token(seq, token, info)
                outputs.append(self._make_output(seq))
        return failed + outputs

    def _accept_draft(self, item: ScheduledSequence, logits: torch.Tensor) -> None:
        """Keep the verified part of a draft (engine/speculative/verifier.py), give back
        the pages of the rest, then append the tokens one at a time through the same
        stop checks as a plain decode step."""
        seq, draft = item.seq, item.draft
        top_n = seq.params.logprobs
        raw = logits
        if seq.grammar is not None:
            from engine.grammar.masks import apply_draft_masks  # xgrammar only when used

            raw = logits.clone() if top_n is not None else logits  # logprobs: the model's own
            seq.grammar.sync(seq.output_token_ids)
            apply_draft_masks(logits, seq.grammar, draft)
        if seq.params.greedy:
            tokens = accept_prefix(draft, greedy_targets(logits))
        else:
            sampled = SampledTargets(logits, seq.params, seq.generator or self.sampler.generator)
            tokens = accept_prefix(draft, sampled.tokens)
            sampled.keep(len(tokens))
        accepted = len(tokens) - 1
        # KV is now valid for the pending token and the accepted draft tokens; the
        # rejected ones' slots are past the end and will be overwritten.
        seq.num_computed_tokens += 1 + accepted
        self.scheduler.rollback(seq)
        self.speculator.verified(seq, len(draft), accepted)
        # On the logits' device: only the requested values cross to the host.
        infos = token_logprobs(raw, tokens, top_n) if top_n is not None else None
        for row, token in enumerate(tokens):
            info = infos[row] if infos is not None else None
            if seq.grammar is not None:
                seq.grammar.accept(token)  # as the sampler does for a sampled token
            self._append_token(seq, token, info)
            if seq.is_finished:
                break

    def _wants_chunk_logits(self, item: ScheduledSequence) -> bool:
        seq = item.seq
        in_prompt = seq.num_computed_tokens < len(seq.prompt_token_ids)
        return in_prompt and (seq.params.prompt_logprobs is not None or seq.collect_logits)

    def _record_prompt_logits(self, item: ScheduledSequence, logits: torch.Tensor) -> None:
        seq = item.seq
        start = seq.num_computed_tokens
        if seq.collect_logits:
            seq.collected_logits.append(logits.cpu())
        if seq.params.prompt_logprobs is None:
            return
        if start == 0:
            seq.prompt_logprobs.append(None)  # nothing predicts the first token
        logprobs = torch.log_softmax(logits, -1)
        prompt = seq.prompt_token_ids
        top_n = seq.params.prompt_logprobs
        for j in range(logprobs.shape[0]):
            target = start + j + 1
            if target < len(prompt):
                token = prompt[target]
                top = {}
                if top_n:
                    values, ids = torch.topk(logprobs[j], top_n)
                    top = dict(zip(ids.tolist(), values.tolist(), strict=True))
                seq.prompt_logprobs.append(TokenLogprob(token, float(logprobs[j, token]), top))

    def _append_token(self, seq: Sequence, token: int, info: TokenLogprob | None) -> None:
        seq.output_token_ids.append(token)
        if info is not None:
            seq.logprobs.append(info)
        params = seq.params
        if seq.grammar is not None and seq.grammar.error:
            seq.error = f"constrained decoding failed: {seq.grammar.error}"
            self.scheduler.finish(seq, "error")
            return
        if (
            token in params.stop_token_ids
            or (token in self.eos_token_ids and not params.ignore_eos)
            or (seq.grammar is not None and seq.grammar.terminated)  # the grammar has ended
        ):
            seq.text += seq.detok.flush()
            seq.stop_reason = token if token in params.stop_token_ids else None
            self.scheduler.finish(seq, "stop")
        else:
            seq.text += seq.detok.add(token)
            if self._check_stop_strings(seq):
                return
            if (
                len(seq.output_token_ids) >= params.max_tokens
                or seq.num_tokens >= self.max_model_len
            ):
                seq.text += seq.detok.flush()
                if not self._check_stop_strings(seq):
                    self.scheduler.finish(seq, "length")

    def _check_stop_strings(self, seq: Sequence) -> bool:
        for stop in seq.params.stop:
            # Only the tail can hold a new match: the old text was checked before.
            window_start = max(0, seq.emitted_text_len - len(stop))
            found = seq.text.find(stop, window_start)
            if found >= 0:
                cut = found + len(stop) if seq.params.include_stop_str_in_output else found
                seq.text = seq.text[:cut]
                seq.stop_reason = stop
                self.scheduler.finish(seq, "stop")
                return True
        return False

    def _make_output(self, seq: Sequence) -> RequestOutput:
        finished = seq.is_finished
        text = seq.text
        if not finished and seq.params.stop:
            # Hold back a tail that could be the start of a stop string.
            hold = max(len(s) for s in seq.params.stop) - 1
            text = text[: max(seq.emitted_text_len, len(text) - hold)]
        delta_text = text[seq.emitted_text_len :]
        seq.emitted_text_len = len(text)
        delta_ids = seq.output_token_ids[seq.emitted_token_len :]
        seq.emitted_token_len = len(seq.output_token_ids)
        if finished:
            self._requests.pop(seq.request_id, None)
        completion = CompletionOutput(
            index=0,
            text=text,
            token_ids=list(seq.output_token_ids),
            logprobs=list(seq.logprobs) if seq.params.logprobs is not None else None,
            finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
            delta_text=delta_text,
            delta_token_ids=delta_ids,
        )
        return RequestOutput(
            request_id=seq.request_id,
            prompt=seq.prompt_text,
            prompt_token_ids=seq.prompt_token_ids,
            outputs=[completion],
            finished=finished,
            prompt_logprobs=seq.prompt_logprobs if seq.params.prompt_logprobs is not None else None,
            num_cached_tokens=seq.num_cached_tokens,
            error=seq.error,
        )

    # ----- prefix pinning and statistics ---------------------------------------
    def pin_prefix(self, token_ids: list[int], cache_salt: str = "") -> list:
        """Protect the cached pages of this prefix from eviction; returns a handle for unpin.

        Under pressure pinned pages still give way, last (engine/kv/prefix_spill.py): they
        stay pinned in the tree without a page until restored or prefilled again."""
        if self.prefix_cache is None:
            return []
        nodes = self.prefix_cache.match(list(token_ids) + [0], cache_salt, record=False).nodes
        self.prefix_cache.pin(nodes)
        return nodes

    def unpin_prefix(self, handle: list) -> None:
        if self.prefix_cache is not None:
            self.prefix_cache.unpin(handle)

    def save_prefix(self, token_ids: list[int], cache_salt: str = "") -> int:
        """Write this prefix's cached pages to the disk tier; returns pages newly written."""
        if self.prefix_store is None:
            return 0
        return self.prefix_store.save(list(token_ids), cache_salt)

    def restore_prefix(self, token_ids: list[int], cache_salt: str = "") -> int:
        """Load this prefix's saved pages into the prefix cache; returns tokens restored."""
        if self.prefix_store is None:
            return 0
        return self.prefix_store.restore(list(token_ids), cache_salt)

    def stats(self) -> dict:
        page = self.config.page_size
        cache_only = 0
        if self.prefix_cache is not None:
            cache_only = self.prefix_cache.pages_held_only_by_cache()
        used_pages = self.allocator.num_pages - self.allocator.num_free - cache_only
        # Triton's backend says whether FP8 pages decode on e4m3 tensor cores.
        describe_backend = getattr(self.runner.backend, "describe", None)
        backend_facts = describe_backend(self.pool, self.dtype) if describe_backend else {}
        return {
            "kv_cache_dtype": self.kv_dtype,
            "page_size": page,
            "capacity_tokens": self.pool.capacity_tokens,
            "used_tokens": used_pages * page,
            "cached_tokens": cache_only * page,
            "cache_hit_rate": self.prefix_cache.hit_rate if self.prefix_cache else 0.0,
            "max_context_tokens": self.max_model_len,
            "kv_bytes_per_token": kv_bytes_per_token(self.layout, self.kv_dtype),
            "kv_rotation": self.kv_rotation,
            "kv_scales": scales_in_force(self.pool, self.kv_rotation),
            "attention_backend": self.runner.backend.name,
            **backend_facts,
            "cpu_kernel": self.cpu_kernel,
            **(self.runner.graphs.describe() if self.runner.graphs is not None else {}),
            # The stepping thread's team (this runs on it): engine.host.threads.
            "compute_threads": torch.get_num_threads(),
            **({**describe_cpu(), **describe_matrix_path()} if self.device.type == "cpu" else {}),
            "weight_bytes": self.weight_bytes,
            "linear_methods": self.linear_methods,
            **self.speculator.stats(),
            **(self.prefix_spill.stats() if self.prefix_spill is not None else {}),
            "parallel": self.executor.describe(),
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
        }
