"""A request's way out: tokens appended, stops decided, text detokenized, outputs built.

A token ends a request when it is a stop token or EOS (unless `ignore_eos`),
when the request's grammar has ended or failed, when the text now holds a
stop string (cut there), or at `max_tokens` or the context's end. Outputs
carry the text so far and what is new since the last one; while a request
runs, a tail that could be the start of a stop string is held back from them.
"""

from __future__ import annotations

import torch

from engine.core.scheduler import Scheduler
from engine.requests.outputs import CompletionOutput, RequestOutput
from engine.requests.sequence import ScheduledSequence, Sequence, TokenLogprob


class OutputProcessor:
    def __init__(self, scheduler: Scheduler, eos_token_ids: set[int], max_model_len: int):
        self.scheduler = scheduler  # finishes requests, which frees their pages
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len

    # ----- prompt logits ---------------------------------------------------------
    def wants_chunk_logits(self, item: ScheduledSequence) -> bool:
        """Whether this prefill chunk's logits are needed: prompt logprobs, or collected."""
        seq = item.seq
        in_prompt = seq.num_computed_tokens < len(seq.prompt_token_ids)
        return in_prompt and (seq.params.prompt_logprobs is not None or seq.collect_logits)

    def record_prompt_logits(self, item: ScheduledSequence, logits: torch.Tensor) -> None:
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

    # ----- generated tokens --------------------------------------------------------
    def append_token(self, seq: Sequence, token: int, info: TokenLogprob | None) -> None:
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

    # ----- outputs -----------------------------------------------------------------
    def make_output(self, seq: Sequence) -> RequestOutput:
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
