"""What FP8 KV costs in accuracy: perplexity and top-1 agreement against BF16 KV.

Every variant is the real engine (`LLM`) on the same model weights (BF16 by
default, as DESIGN.md §3 measured), differing only in the KV cache: BF16 KV
is the reference; FP8 KV with one scale per tensor (per layer, for K and for
V), with one scale per KV head, and with the Hadamard rotation; BF16 KV with
the rotation shows the rotation alone changes nothing beyond rounding.

Texts nobody in this project wrote: the CPython standard library's top-level
`.py` files (sorted by name, concatenated) of the running interpreter, and
English prose, the licence texts under /usr/share/common-licenses (GPL-3,
then Apache-2.0, GFDL-1.3, MPL-2.0, LGPL-2.1; CPython's own LICENSE.txt when
that folder is absent). Each text is cut into consecutive windows of the
context length (2k, and the model's limit, 8k for SmolLM2, less one token
for the one the engine generates), each window a fresh request starting at
position 0.

The path is the engine's own: a window is one request, prefilled in chunks
through the paged cache (attention reads K and V back as stored,
dequantized, this chunk's tokens included) up to its last `decode_tokens`
tokens, which then run as decode steps, one token per step over the cached
context (`LLM.prompt_logits(..., decode_last=N)`). Every position predicts the
next token of the window; perplexity is exp(mean NLL) over all of them,
top-1 agreement the share of positions whose argmax equals the BF16-KV
run's. FP8 scales are calibrated once per variant on held-out text (the
tokens after the scored ones, both texts) with `LLM.calibrate_kv_scales`, or
with `calibration="first-prefill"` from the first window, as a server does.
"""

from __future__ import annotations

import gc
import platform
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.devtools.benchmarks.serving import DEFAULT_MODEL, machine

LICENCE_DIR = Path("/usr/share/common-licenses")
PROSE_FILES = ("GPL-3", "Apache-2.0", "GFDL-1.3", "MPL-2.0", "LGPL-2.1")
REFERENCE = "bf16"
VARIANTS = {
    REFERENCE: dict(kv_cache_dtype="bf16", kv_rotation="none"),
    "bf16_hadamard": dict(kv_cache_dtype="bf16", kv_rotation="hadamard"),
    "fp8_per_tensor": dict(kv_cache_dtype="fp8_e4m3", kv_rotation="none"),
    "fp8_per_head": dict(kv_cache_dtype="fp8_e4m3", kv_rotation="none", kv_scales_per_head=True),
    "fp8_hadamard": dict(kv_cache_dtype="fp8_e4m3", kv_rotation="hadamard"),
    "fp8_hadamard_per_head": dict(
        kv_cache_dtype="fp8_e4m3", kv_rotation="hadamard", kv_scales_per_head=True
    ),
}
DEFAULT_VARIANTS = ("fp8_per_tensor", "fp8_per_head", "fp8_hadamard", "bf16_hadamard")
DEFAULT_CONTEXTS = (2048, 8192)
DEFAULT_WINDOWS = {"python": (6, 1), "prose": (2, 1)}  # per context, in DEFAULT_CONTEXTS order
# DESIGN.md §3's targets for rotated FP8 on the Python source at 2k windows.
TARGET = {"variant": "fp8_hadamard", "text": "python", "max_delta_pct": 0.5, "min_top1": 0.965}


@dataclass
class Text:
    name: str
    source: str
    ids: list[int]


def _tokens_from(parts: list[str], tokenizer, need: int) -> list[int]:
    """The first `need` token ids of the parts joined (fewer when the parts run out)."""
    budget = 6 * need  # characters: about 3-4 per token, so usually one pass
    while True:
        chosen, size = [], 0
        for part in parts:
            if size >= budget:
                break
            chosen.append(part)
            size += len(part)
        ids = tokenizer.encode("\n\n".join(chosen), add_special_tokens=False)
        if len(ids) >= need or len(chosen) == len(parts):
            return ids[:need]
        budget *= 2


def python_text(tokenizer, need: int) -> Text:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"))
    parts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
    source = (
        f"CPython {platform.python_version()} stdlib {stdlib}/*.py ({len(files)} files, sorted)"
    )
    return Text("python", source, _tokens_from(parts, tokenizer, need))


def prose_text(tokenizer, need: int) -> Text:
    files = [LICENCE_DIR / name for name in PROSE_FILES if (LICENCE_DIR / name).is_file()]
    if not files:  # not a Debian-style system: CPython's own licence is prose too
        files = [Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt"]
    files = [f for f in files if f.is_file()]
    parts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
    source = "licence texts: " + ", ".join(str(f) for f in files)
    return Text("prose", source, _tokens_from(parts, tokenizer, need))


def _scorer(ids: torch.Tensor):
    """reduce(logits, start) -> [rows, 3] float64: position, NLL of the next token, argmax."""

    def reduce(logits: torch.Tensor, start: int) -> torch.Tensor:
        targets = ids[start + 1 : start + 1 + logits.shape[0]]
        rows = targets.shape[0]
        logprobs = torch.log_softmax(logits[:rows].float(), dim=-1)
        nll = -logprobs.gather(1, targets[:, None]).squeeze(1)
        positions = torch.arange(start, start + rows)
        top = logits[:rows].argmax(-1)
        return torch.stack([positions.double(), nll.double(), top.double()], dim=1)

    return reduce


def score_window(llm, window: list[int], decode_tokens: int) -> tuple[torch.Tensor, int]:
    """Per position [len-1, 2] (NLL, argmax) and how many were decode steps.

    One request: the window's head is prefilled in chunks, its last
    `decode_tokens` tokens run as decode steps (one token per step).
    """
    ids = torch.tensor(window)
    decode = min(decode_tokens, len(window) - 1)
    rows = llm.prompt_logits(window, reduce=_scorer(ids), decode_last=decode)
    if not torch.equal(rows[:, 0], torch.arange(len(window) - 1, dtype=torch.float64)):
        raise RuntimeError("scored positions do not cover the window")
    # The window's last token is decoded too but predicts nothing inside the window.
    return rows[:, 1:], max(0, decode - 1)


def _windows(ids: list[int], context: int, count: int) -> list[list[int]]:
    return [ids[i * context : (i + 1) * context] for i in range(min(count, len(ids) // context))]


def _open_model(model: str, workdir: Path) -> tuple[str, str]:
    """(path, label): `tiny:FAMILY` builds a tiny random checkpoint (engine.devtools.testing)."""
    if not model.startswith("tiny:"):
        return model, model
    from engine.devtools.testing.checkpoints import make_checkpoint

    family = model.split(":", 1)[1]
    return str(make_checkpoint(family, workdir / family).path), f"{model} (random weights)"


def _run_variant(path, name, dtype, plan, calibration_prompts, decode_tokens) -> dict:
    from engine import LLM

    start = time.perf_counter()
    llm = LLM(path, dtype=dtype, **VARIANTS[name])
    engine = llm.engine
    if engine.pool.is_fp8 and calibration_prompts:
        llm.calibrate_kv_scales(calibration_prompts)
    scores, decoded = {}, {}
    for key, windows in plan.items():
        rows = [score_window(llm, w, decode_tokens) for w in windows]
        scores[key] = torch.cat([r[0] for r in rows])
        decoded[key] = sum(r[1] for r in rows)
    stats = engine.stats()
    info = {
        "kv_cache_dtype": engine.kv_dtype,
        "kv_rotation": engine.kv_rotation,
        "rotation_detail": engine.kv_rotation_detail,
        "kv_scales": stats["kv_scales"],
        "seconds": round(time.perf_counter() - start, 1),
    }
    del llm, engine
    gc.collect()
    return {"scores": scores, "decoded": decoded, "info": info}


def _row(name, text, context, windows, result, reference) -> dict:
    key = (text, context)
    got, ref = result["scores"][key], reference["scores"][key]
    ppl = float(torch.exp(got[:, 0].mean()))
    ref_ppl = float(torch.exp(ref[:, 0].mean()))
    return {
        "variant": name,
        "text": text,
        "context": context,
        "windows": windows,
        "positions": int(got.shape[0]),
        "decode_positions": result["decoded"][key],
        "ppl": round(ppl, 4),
        "delta_pct": round((ppl / ref_ppl - 1) * 100, 3),
        "top1_agreement": round(float((got[:, 1] == ref[:, 1]).double().mean()), 4),
        "mean_abs_nll_diff": round(float((got[:, 0] - ref[:, 0]).abs().mean()), 5),
    }


def _compare(got: torch.Tensor, ref: torch.Tensor) -> dict:
    diff = (got[:, 0] - ref[:, 0]).abs()
    return {
        "mean_abs_nll_diff": float(diff.mean()),
        "max_abs_nll_diff": float(diff.max()),
        "top1_agreement": round(float((got[:, 1] == ref[:, 1]).double().mean()), 4),
    }


def _rotation_check(path, window, decode_tokens, bf16_scores, bf16_rotated_scores) -> dict:
    """Rotation alone, on one window: float32 weights and KV (exact up to summation order),
    and in BF16 next to the yardstick of BF16 itself against float32."""
    from engine import LLM

    scores = {}
    for rotation in ("none", "hadamard"):
        llm = LLM(path, dtype="float32", kv_cache_dtype="auto", kv_rotation=rotation)
        scores[rotation] = score_window(llm, window, decode_tokens)[0]
        del llm
        gc.collect()
    check = {
        "positions": len(window) - 1,
        "float32_rotated_vs_plain": _compare(scores["hadamard"], scores["none"]),
        "bf16_vs_float32": _compare(bf16_scores, scores["none"]),
    }
    if bf16_rotated_scores is not None:
        check["bf16_rotated_vs_plain"] = _compare(bf16_rotated_scores, bf16_scores)
    return check


def run_accuracy(
    model: str = DEFAULT_MODEL,
    variants: tuple[str, ...] = DEFAULT_VARIANTS,
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS,
    python_windows: tuple[int, ...] = DEFAULT_WINDOWS["python"],
    prose_windows: tuple[int, ...] = DEFAULT_WINDOWS["prose"],
    decode_tokens: int = 32,
    dtype: str = "bfloat16",
    calibration: str = "held-out",
    calibration_tokens: int = 2048,
) -> dict:
    unknown = [v for v in variants if v not in VARIANTS or v == REFERENCE]
    if unknown:
        raise ValueError(
            f"unknown variants {unknown}; known: {sorted(set(VARIANTS) - {REFERENCE})}"
        )
    if calibration not in ("held-out", "first-prefill"):
        raise ValueError("calibration is held-out or first-prefill")
    if len(python_windows) != len(contexts) or len(prose_windows) != len(contexts):
        raise ValueError("give one window count per context, for each text")
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        path, label = _open_model(model, Path(scratch))
        from engine.model_files.model_config import load_config
        from engine.model_files.store import resolve_model
        from engine.tokenizers.loading import load_tokenizer

        model_dir = resolve_model(path)
        tokenizer = load_tokenizer(model_dir)
        limit = load_config(model_dir).max_position_embeddings - 1  # + the generated token
        contexts = tuple(min(c, limit) for c in contexts)
        counts = {"python": python_windows, "prose": prose_windows}
        texts, plan, layout = {}, {}, []
        for name, loader in (("python", python_text), ("prose", prose_text)):
            scored = max(c * n for c, n in zip(contexts, counts[name], strict=True))
            text = loader(tokenizer, scored + calibration_tokens)
            texts[name] = text
            for context, count in zip(contexts, counts[name], strict=True):
                windows = _windows(text.ids[:scored], context, count)
                if windows and (name, context) not in plan:
                    plan[(name, context)] = windows
                    layout.append((name, context, len(windows)))
        prompts = []
        for name, text in texts.items():
            scored = max(c * n for c, n in zip(contexts, counts[name], strict=True))
            held_out = text.ids[scored : scored + calibration_tokens][: limit - 1]
            if len(held_out) > 16:
                prompts.append(held_out)
        if calibration == "first-prefill":
            prompts = []
        results = {}
        for name in (REFERENCE, *variants):
            results[name] = _run_variant(path, name, dtype, plan, prompts, decode_tokens)
        first = layout[0][:2]  # the first window of the first (text, context)
        window = plan[first][0]
        n = len(window) - 1
        rotated = results.get("bf16_hadamard")
        rotation_check = {"text": first[0], "context": first[1]} | _rotation_check(
            path,
            window,
            decode_tokens,
            results[REFERENCE]["scores"][first][:n],
            rotated["scores"][first][:n] if rotated is not None and dtype == "bfloat16" else None,
        )
    rows = [
        _row(name, text, context, windows, results[name], results[REFERENCE])
        for name in (REFERENCE, *variants)
        for text, context, windows in layout
    ]
    target_row = next(
        (
            r
            for r in rows
            if r["variant"] == TARGET["variant"]
            and r["text"] == TARGET["text"]
            and r["context"] == min(contexts)
        ),
        None,
    )
    target = {**TARGET, "context": min(contexts), "met": None}
    if target_row is not None:
        target["met"] = (
            target_row["delta_pct"] <= TARGET["max_delta_pct"]
            and target_row["top1_agreement"] >= TARGET["min_top1"]
        )
    return {
        "benchmark": "accuracy",
        "model": label,
        "model_dtype": dtype,
        "reference": f"{REFERENCE} KV cache, same model and path",
        "variants": {name: results[name]["info"] for name in (REFERENCE, *variants)},
        "texts": {k: {"source": t.source, "tokens": len(t.ids)} for k, t in texts.items()},
        "contexts": list(dict.fromkeys(contexts)),
        "decode_tokens_per_window": decode_tokens,
        "calibration": {
            "mode": calibration,
            "prompts": len(prompts),
            "tokens": sum(len(p) for p in prompts),
        },
        "rows": rows,
        "rotation_check": rotation_check,
        "target": target,
        "seconds": round(time.perf_counter() - began, 1),
        "machine": machine(),
    }


def format_table(result: dict) -> str:
    """A Markdown table of the rows, with what was measured above it."""
    lines = [
        f"model {result['model']} ({result['model_dtype']} weights), reference: "
        f"{result['reference']}; {result['seconds']} s",
        "",
        "| variant | text | context | windows | ppl | delta % | top-1 agreement |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['variant']} | {r['text']} | {r['context']} | {r['windows']} | {r['ppl']:.4f} "
            f"| {r['delta_pct']:+.2f} | {100 * r['top1_agreement']:.2f}% |"
        )
    check = result.get("rotation_check")
    if check:
        exact = check["float32_rotated_vs_plain"]
        lines += [
            "",
            f"rotation alone ({check['text']}, first {check['context']}-token window): "
            f"float32 max |dNLL| {exact['max_abs_nll_diff']:.2e}, top-1 "
            f"{100 * exact['top1_agreement']:.2f}%; BF16 vs float32 mean |dNLL| "
            f"{check['bf16_vs_float32']['mean_abs_nll_diff']:.2e}"
            + (
                f", BF16 rotated vs plain {check['bf16_rotated_vs_plain']['mean_abs_nll_diff']:.2e}"
                if "bf16_rotated_vs_plain" in check
                else ""
            ),
        ]
    target = result["target"]
    if target["met"] is not None:
        lines.append("")
        lines.append(
            f"target ({target['variant']}, {target['text']}, {target['context']}): "
            f"<= +{target['max_delta_pct']}% ppl, >= {100 * target['min_top1']:.1f}% top-1: "
            f"{'met' if target['met'] else 'NOT met'}"
        )
    return "\n".join(lines)
