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

from engine.attention.torch_backend import get_backend
from engine.config import DEFAULT_CPU_KV_GIB, EngineConfig
from engine.cpu_kernels.library import unavailable as cpu_kernels_unavailable
from engine.detokenizer import IncrementalDetokenizer
from engine.errors import EngineError, KVCapacityError, PromptTooLongError
from engine.kv import make_pool
from engine.kv.pages import PageAllocator
from engine.kv.pool import PagedKVPool
from engine.kv.radix import RadixCache
from engine.kv.scales import (
    apply_fixed_scales,
    read_scales_file,
    resolve_rotation,
    scales_in_force,
)
from engine.kv.sizing import capacity_tokens, kv_bytes_per_token
from engine.layers.batch_invariant import make_linear_layers_batch_invariant
from engine.layers.cpu_fused import use_cpu_layer_kernels
from engine.layers.cpu_grid_weights import pack_grid_weights
from engine.loader import cast_parameters, load_model
from engine.outputs import CompletionOutput, RequestOutput
from engine.runner import ModelRunner
from engine.sampler import Sampler, token_logprobs
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledSequence, Scheduler
from engine.sequence import Sequence, TokenLogprob
from engine.speculative import Speculator
from engine.speculative.verifier import accept_greedy, greedy_targets
from engine.tokenizer import load_tokenizer

log = logging.getLogger(__name__)
GIB = 1024**3


def resolve_dtype(name: str, config_dtype: str | None, device: torch.device) -> torch.dtype:
    if name == "float32":
        return torch.float32
    if name == "bfloat16":
        return torch.bfloat16
    if config_dtype in ("float32", "torch.float32"):
        return torch.float32
    return torch.bfloat16


def resolve_kv_dtype(name: str, model_dtype: torch.dtype) -> str:
    if name == "auto":
        return "float32" if model_dtype == torch.float32 else "bf16"
    return name


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
        from engine.model_store import resolve_model

        self.config = config
        self.model_dir = resolve_model(config.model)
        self.device = torch.device(
            config.device or ("cuda" if torch.cuda.is_available() else "cpu")
        )
        self.tokenizer = load_tokenizer(self.model_dir)
        from engine.model_config import load_config

        model_cfg = load_config(self.model_dir)
        self.dtype = resolve_dtype(config.dtype, model_cfg.torch_dtype_name, self.device)
        # CPU, BF16: load in float32 first, so that weights lying on a 4- or 8-bit
        # grid (a quantized checkpoint's, like the default model's) can be packed
        # exactly before the cast (engine.layers.cpu_grid_weights.py).
        self.cpu_kernel = "none"  # set when packing: int8 or bf16
        self.packs_cpu_weights = (
            self.device.type == "cpu" and self.dtype == torch.bfloat16 and not config.deterministic
        )
        self.model, self.model_config, ckpt_scales = load_model(
            self.model_dir, torch.float32 if self.packs_cpu_weights else self.dtype, self.device
        )
        self.kv_dtype = resolve_kv_dtype(config.kv_cache_dtype, self.dtype)
        self.max_model_len = config.max_model_len or self.model_config.max_position_embeddings
        if self.max_model_len > self.model_config.max_position_embeddings:
            raise EngineError(
                f"max_model_len {self.max_model_len} exceeds the model's "
                f"max_position_embeddings {self.model_config.max_position_embeddings}"
            )
        self.layout = self.model.kv_layout()
        self._setup_kv_rotation(ckpt_scales)
        if self.packs_cpu_weights:
            self._pack_and_cast()
            self._use_cpu_layer_kernels()
        self.pool = self._build_pool(ckpt_scales)
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
        if config.deterministic:
            self._enable_deterministic()
        self.runner = ModelRunner(
            self.model,
            self.pool,
            get_backend(config.attention_backend, config.deterministic),
            config.page_size,
            self.device,
        )
        self.prefix_store = self._open_prefix_store()
        self.sampler = Sampler(config.seed)
        self.eos_token_ids = _eos_ids(self.model_dir, self.tokenizer)
        self._requests: dict[str, Sequence] = {}
        self._ids = itertools.count()

    # ----- set-up -------------------------------------------------------------
    def _kv_budget_bytes(self, per_token: int) -> int:
        if self.config.kv_memory_gib is not None:
            return int(self.config.kv_memory_gib * GIB)
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return int(free * 0.85)
        # Enough for the default CPU budget, and always for one full-length sequence.
        return max(int(DEFAULT_CPU_KV_GIB * GIB), 2 * self.max_model_len * per_token)

    def _resolve_cpu_kernel(self) -> str:
        """int8 activations where the VNNI kernel runs, else torch's BF16 int4 kernel."""
        wanted = self.config.cpu_kernel
        if wanted == "bf16":
            return "bf16"
        reason = cpu_kernels_unavailable()
        if not reason:
            return "int8"
        if wanted == "int8":
            raise EngineError(f"--cpu-kernel int8 cannot run here: {reason}; use bf16 or auto")
        log.info("CPU int8 grid kernel unavailable (%s); using torch's int4 kernel", reason)
        return "bf16"

    def _pack_and_cast(self) -> None:
        """Pack grid weights (exact), then cast the model to BF16."""
        self.cpu_kernel = self._resolve_cpu_kernel()
        report = pack_grid_weights(self.model, self.cpu_kernel)
        cast_parameters(self.model, self.dtype)
        log.info(
            "CPU packed weights (%s activations): %d on a 4-bit grid, %d on an 8-bit grid, "
            "%d dense, %.3f GiB packed, %.3f GiB of dense copies dropped",
            self.cpu_kernel,
            report["4-bit"],
            report["8-bit"],
            report["dense"],
            report["packed_bytes"] / GIB,
            report["dropped_bytes"] / GIB,
        )

    def _use_cpu_layer_kernels(self) -> None:
        """Norms, rotary, SwiGLU, rotations and whole decode steps in C where it runs
        (engine/layers/cpu_fused.py); the model's torch code otherwise."""
        if cpu_kernels_unavailable():
            return
        routed = use_cpu_layer_kernels(self.model)
        log.info("CPU layer kernels: %s", ", ".join(f"{n} {k}" for k, n in routed.items()))

    def _setup_kv_rotation(self, ckpt_scales) -> None:
        """Decide the K/V rotation (DESIGN.md §3) and set it up; for MLA that folds the
        latent rotation into the weights, so it runs before anything packs or copies them."""
        config = self.config
        self.kv_scales_file = (
            read_scales_file(config.kv_scales_file, self.layout.kind)
            if config.kv_scales_file
            else None
        )
        self.kv_rotation = resolve_rotation(
            config.kv_rotation, self.kv_dtype, self.kv_scales_file, ckpt_scales is not None
        )
        self.kv_rotation_detail = ""
        if self.kv_rotation == "hadamard":
            self.kv_rotation_detail = self.model.enable_kv_rotation(config.deterministic)
            log.info("KV rotation: hadamard (%s)", self.kv_rotation_detail)

    def _build_pool(self, ckpt_scales) -> PagedKVPool:
        page = self.config.page_size
        per_token = kv_bytes_per_token(self.layout, self.kv_dtype)
        budget = self._kv_budget_bytes(per_token)
        capacity = capacity_tokens(budget, self.layout, self.kv_dtype, page)
        num_pages = capacity // page
        if capacity < self.max_model_len:
            raise KVCapacityError(
                f"the KV budget of {budget / GIB:.3f} GiB holds {capacity} tokens "
                f"({per_token} bytes/token in {self.kv_dtype}), less than one sequence of "
                f"max_model_len={self.max_model_len}; raise --kv-memory to at least "
                f"{self.max_model_len * per_token / GIB:.3f} GiB or lower --max-model-len"
            )
        per_head = self.config.kv_scales_per_head
        pool = make_pool(self.layout, num_pages, page, self.kv_dtype, self.device, per_head)
        apply_fixed_scales(pool, self.kv_rotation, self.kv_scales_file, ckpt_scales, per_head)
        log.info(
            "KV cache: %s, %d pages of %d tokens = %d tokens, %.3f GiB, scales from %s",
            self.kv_dtype,
            num_pages,
            page,
            capacity,
            pool.nbytes / GIB,
            pool.scale_source,
        )
        return pool

    def _open_prefix_store(self):
        if not (self.config.kv_disk and self.prefix_cache is not None):
            return None
        from engine.kv.disk_tier import default_root
        from engine.prefix_store import PrefixStore

        root = Path(self.config.kv_disk_dir) if self.config.kv_disk_dir else default_root()
        return PrefixStore(self, root, int(self.config.kv_disk_gib * GIB))

    def _enable_deterministic(self) -> None:
        if not getattr(self.model, "supports_deterministic", False):
            raise EngineError(
                f"--deterministic is implemented for dense GQA models (Llama, Qwen2, GLM-4); "
                f"{self.model_config.architecture} is not one yet"
            )
        make_linear_layers_batch_invariant(self.model)

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
        if self.config.deterministic:
            # One thread: no reduction is split across threads differently for
            # different batch shapes.
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                out = self.runner.run(batch, want)
            finally:
                torch.set_num_threads(threads)
        else:
            out = self.runner.run(batch, want)
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
        tokens = accept_greedy(draft, greedy_targets(logits))
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
        """Protect the cached pages of this prefix from eviction; returns a handle for unpin."""
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
            "cpu_kernel": self.cpu_kernel,
            **self.speculator.stats(),
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
        }
