"""The sampler's time per step, before and after sampling moved onto the device; prints JSON.

    python bench/sampling.py                   # CPU, vocab 163,840 (Kimi), batch 1/16/64
    python bench/sampling.py --device cuda     # the same on a GPU (old path: copy to host),
                                               # and the share of tokens equal to the CPU's
    python bench/sampling.py --quick           # small vocab, one round (smoke test)

`old` is the per-row sampler this replaced (copied below, as it was): the whole
[batch, vocab] logits to the host, then per row penalties, filters,
torch.multinomial and log_softmax. `new` is engine.sampling.sampler.Sampler. Both run in
the same process on the same logits; each figure is the best of a few rounds,
in milliseconds per step. Scenarios:
- greedy: temperature 0 (one argmax over the batch in both);
- temperature: temperature 0.8 alone;
- top_p_peaked: temperature 0.7, top_p 0.95 on logits with a few dominant tokens
  (as in code generation: the nucleus lies inside the top-p candidate search);
- top_p_flat: the same on Gaussian logits (a nucleus of thousands: a full sort);
- mixed: rows cycling through greedy, penalties (a 2,000-token prompt, 200
  outputs), top-k, top-p, min-p, and logprobs=5 on every third row.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from functools import partial

import torch

from engine.cpu_kernels.argmax import row_argmax
from engine.requests.params import SamplingParams
from engine.requests.sequence import Sequence, TokenLogprob
from engine.sampling.sampler import Sampler

# ----- the sampler before issue 16 item 5 (engine/sampling/sampler.py at ab10e63) -------------


def old_apply_penalties(logits: torch.Tensor, seq: Sequence) -> torch.Tensor:
    p = seq.params
    if not seq.output_token_ids or (
        p.presence_penalty == 0 and p.frequency_penalty == 0 and p.repetition_penalty == 1
    ):
        return logits
    logits = logits.clone()
    if p.repetition_penalty != 1:
        seen = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.long, device=logits.device)
        values = logits[seen]
        logits[seen] = torch.where(
            values > 0, values / p.repetition_penalty, values * p.repetition_penalty
        )
    if p.presence_penalty or p.frequency_penalty:
        ids = torch.tensor(seq.output_token_ids, dtype=torch.long, device=logits.device)
        counts = torch.bincount(ids, minlength=logits.shape[-1]).to(logits.dtype)
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def old_filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = (probs.cumsum(-1) - probs) > params.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(0, order, sorted_logits)
    if params.min_p > 0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    return logits


def old_token_logprob(logprobs: torch.Tensor, token: int, top_n: int) -> TokenLogprob:
    top: dict[int, float] = {}
    if top_n > 0:
        values, ids = torch.topk(logprobs, top_n)
        top = dict(zip(ids.tolist(), values.tolist(), strict=True))
    return TokenLogprob(token_id=token, logprob=float(logprobs[token]), top=top)


def old_sample(
    logits: torch.Tensor, seqs: list[Sequence], generator: torch.Generator
) -> list[tuple[int, TokenLogprob | None]]:
    logits = logits.float().cpu()
    greedy = any(seq.params.greedy for seq in seqs)
    argmax = row_argmax(logits).tolist() if greedy else []
    results = []
    for index, (row, seq) in enumerate(zip(logits, seqs, strict=True)):
        params = seq.params
        adjusted = old_apply_penalties(row, seq)
        if params.greedy:
            token = argmax[index] if adjusted is row else int(torch.argmax(adjusted))
        else:
            probs = old_filter_logits(adjusted, params).softmax(-1)
            token = int(torch.multinomial(probs, 1, generator=seq.generator or generator))
        info = None
        if params.logprobs is not None:
            info = old_token_logprob(torch.log_softmax(row, -1), token, params.logprobs)
        results.append((token, info))
    return results


# ----- the measurement ----------------------------------------------------------------


def make_logits(batch: int, vocab: int, peaked: bool, device: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(batch)
    logits = torch.randn(batch, vocab, generator=gen) * (1.5 if peaked else 3.0)
    if peaked:
        # A handful of dominant tokens per row, as a language model's next token has.
        top = torch.randint(vocab, (batch, 8), generator=gen)
        logits.scatter_(1, top, 12.0 + 2 * torch.rand(batch, 8, generator=gen))
    return logits.to(device)


MIXED = [
    SamplingParams(temperature=0),
    SamplingParams(temperature=0.7, top_p=0.95, repetition_penalty=1.1),
    SamplingParams(temperature=1.0, top_k=40, frequency_penalty=0.3, presence_penalty=0.3),
    SamplingParams(temperature=0.8, min_p=0.05),
    SamplingParams(temperature=0, repetition_penalty=1.2),
    SamplingParams(temperature=0.6, top_k=20, top_p=0.9),
]


def make_seqs(scenario: str, batch: int, vocab: int) -> list[Sequence]:
    gen = torch.Generator().manual_seed(1)
    seqs = []
    for i in range(batch):
        if scenario == "greedy":
            params = SamplingParams(temperature=0)
        elif scenario == "temperature":
            params = SamplingParams(temperature=0.8)
        elif scenario.startswith("top_p"):
            params = SamplingParams(temperature=0.7, top_p=0.95)
        else:
            params = MIXED[i % len(MIXED)]
            params = SamplingParams(**{**params.__dict__, "logprobs": 5 if i % 3 == 0 else None})
        prompt = torch.randint(vocab, (2000,), generator=gen).tolist()
        seq = Sequence(f"r{i}", prompt, params, generator=torch.Generator().manual_seed(i))
        seq.output_token_ids = torch.randint(vocab, (200,), generator=gen).tolist()
        seqs.append(seq)
    return seqs


def best_ms(fn, device: str, rounds: int) -> float:
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    fn()
    sync()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return round(best * 1e3, 3)


def nucleus_size(logits: torch.Tensor, temperature: float, top_p: float) -> int:
    probs = (logits[0].float() / temperature).softmax(-1).sort(descending=True).values
    return int(((probs.cumsum(-1) - probs) <= top_p).sum())


def agreement(logits: torch.Tensor, scenario: str, vocab: int, steps: int = 5) -> float:
    """Share of tokens the device picks that the CPU picks too, for the same logits
    and the same seeded requests (engine.sampling.draw: they should all agree but
    for rounding at a cumulative-sum boundary)."""
    runs = []
    for device_logits in (logits, logits.cpu()):
        seqs, sampler = make_seqs(scenario, logits.shape[0], vocab), Sampler(0)
        runs.append([t for _ in range(steps) for t, _ in sampler.sample(device_logits, seqs)])
    same = sum(a == b for a, b in zip(*runs, strict=True))
    return round(same / len(runs[0]), 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--vocab", type=int, default=163_840)
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.vocab, args.batches, args.rounds = 4096, "1,4", 1
    torch.set_num_threads(args.threads)
    scenarios = ["greedy", "temperature", "top_p_peaked", "top_p_flat", "mixed"]
    results = []
    for scenario in scenarios:
        for batch in [int(b) for b in args.batches.split(",")]:
            logits = make_logits(batch, args.vocab, scenario != "top_p_flat", args.device)
            seqs = make_seqs(scenario, batch, args.vocab)
            generator = torch.Generator().manual_seed(0)
            old_step = partial(old_sample, logits, seqs, generator)
            old = best_ms(old_step, args.device, args.rounds)
            new = best_ms(partial(Sampler(0).sample, logits, seqs), args.device, args.rounds)
            entry = {"scenario": scenario, "batch": batch, "old_ms": old, "new_ms": new}
            entry["speedup"] = round(old / new, 2) if new else None
            if scenario.startswith("top_p"):
                entry["nucleus_tokens_row0"] = nucleus_size(logits, 0.7, 0.95)
            if args.device != "cpu" and scenario != "greedy":
                entry["same_tokens_as_cpu"] = agreement(logits, scenario, args.vocab)
            results.append(entry)
    device = args.device
    if device.startswith("cuda"):
        device = torch.cuda.get_device_name()
    info = {"device": device, "cpu": platform.processor() or platform.machine()}
    info |= {"threads": args.threads, "vocab": args.vocab, "torch": torch.__version__}
    print(json.dumps({"machine": info, "results": results}, indent=1))


if __name__ == "__main__":
    main()
