"""The verdict table of `gpu_check.py --quick`: each target met, not met, or not measured.

Pure functions of the result dict (no GPU, no torch), so the CPU suite
checks them. Thresholds are issue 28's (TARGETS, below); a target
whose part failed or was skipped is "not measured" with the part's reason,
never "met".
"""

from __future__ import annotations

CONTEXT = 32768
# Issue 28's targets, as (name, threshold); `verdicts` reads them.
TARGETS = {
    "gqa_speedup_b16": 1.7,  # FP8 / BF16 decode time at 32k, batch >= 16
    "gqa_copy_b16": 0.75,  # FP8 bytes/s as a share of copy, batch >= 16
    "gqa_copy_b1": 0.50,
    "mla_copy_b16": 0.65,
    "mla_speedup_b16": 1.6,
    "w4a16_copy_m16": 0.60,  # weight bytes/s at M <= 16, share of copy
    "w4a16_vs_bf16_m2048": 1.5,  # at most this many times torch BF16's time
    "fp8_vs_scaled_mm_m64": 0.9,  # speed relative to torch._scaled_mm rowwise
    "fp8_vs_scaled_mm_m2048": 0.7,
    "moe_int4_vs_bf16_t64": 1.0,  # at most the fused BF16 MoE's time
    "e2e_glm_tok_s": 5000.0,
    "gpu_busy": 0.85,
}


def _reason(result: dict, part: str) -> str:
    value = result.get(part)
    if isinstance(value, dict) and "error" in value:
        return value["error"][:120]
    return "not run" if value is None else "no rows at the target shape"


def _row(target: str, met, measured: str, note: str = "") -> dict:
    return {"target": target, "met": met, "measured": measured, "note": note}


def _at_least(target: str, values: list[float], threshold: float, why: str, unit="") -> dict:
    if not values:
        return _row(target, None, "-", why)
    worst = min(values)
    return _row(target, worst >= threshold, f"{worst:.2f}{unit} (>= {threshold}{unit})")


def _decode(result: dict, kind: str, batches) -> list[dict]:
    rows = result.get("decode") if isinstance(result.get("decode"), list) else []
    return [r for r in rows if r.get("kind") == kind and r.get("context") == CONTEXT
            and r.get("batch") in batches and "error" not in r]  # fmt: skip


def _timings(result: dict, kernel: str) -> list[dict]:
    quant = result.get("quant") if isinstance(result.get("quant"), dict) else {}
    return [r for r in quant.get("timings", []) if r.get("kernel") == kernel]


def _passed(result: dict, part: str, target: str) -> dict:
    value = result.get(part)
    if not isinstance(value, dict) or "ok" not in value:
        return _row(target, None, "-", _reason(result, part))
    failures = "; ".join(value.get("failures", []))[:300]
    return _row(target, bool(value["ok"]), value.get("summary", ""), failures)


def _checks(checks: list[dict] | None, target: str, why: str) -> dict:
    if not checks:
        return _row(target, None, "-", why)
    bad = [c.get("check", "?") for c in checks if not c.get("ok")]
    return _row(target, not bad, f"{len(checks) - len(bad)}/{len(checks)} ok", ", ".join(bad))


def attention_verdicts(result: dict, t: dict) -> list[dict]:
    copy = result.get("copy_gbs")
    why = _reason(result, "decode" if isinstance(copy, float) else "copy_gbs")
    copy = copy if isinstance(copy, float) and copy > 0 else None
    big, one = (16, 32, 64, 128, 256), (1,)

    def share(kind, batches):
        return [r["fp8_gbs"] / copy for r in _decode(result, kind, batches)] if copy else []

    def speed(kind, batches):
        return [r["speedup"] for r in _decode(result, kind, batches)]

    return [
        _at_least("GQA decode 32k, batch >= 16: FP8 vs BF16", speed("gqa", big),
                  t["gqa_speedup_b16"], why, "x"),
        _at_least("GQA decode 32k, batch >= 16: FP8 share of copy", share("gqa", big),
                  t["gqa_copy_b16"], why),
        _at_least("GQA decode 32k, batch 1: FP8 share of copy", share("gqa", one),
                  t["gqa_copy_b1"], why),
        _at_least("MLA decode 32k, batch >= 16: FP8 share of copy", share("mla", big),
                  t["mla_copy_b16"], why),
        _at_least("MLA decode 32k, batch >= 16: FP8 vs BF16", speed("mla", big),
                  t["mla_speedup_b16"], why, "x"),
    ]  # fmt: skip


def gemm_verdicts(result: dict, t: dict) -> list[dict]:
    why = _reason(result, "quant")
    copy = result.get("copy_gbs") if isinstance(result.get("copy_gbs"), float) else None
    w4 = _timings(result, "w4a16")
    fp8 = _timings(result, "fp8_block")
    small_w4 = [r["weight_gbs"] / copy for r in w4 if r["m"] <= 16] if copy else []
    big_w4 = [r["torch_bf16_ms"] / r["kernel_ms"] for r in w4 if r["m"] >= 2048]

    def vs_scaled(rows):  # GEMM alone against _scaled_mm alone: both leave out quantizing
        return [r["scaled_mm_rowwise_ms"] / r["gemm_only_ms"] for r in rows
                if "scaled_mm_rowwise_ms" in r]  # fmt: skip

    moe = {r["kernel"]: r["kernel_ms"] for r in _timings(result, "fused_moe_int4")
           + _timings(result, "fused_moe_bf16") if r.get("tokens") == 64}  # fmt: skip
    moe_ratio = ([moe["fused_moe_bf16"] / moe["fused_moe_int4"]]
                 if len(moe) == 2 else [])  # fmt: skip
    return [
        _at_least("W4A16 M <= 16: weight bytes/s, share of copy", small_w4, t["w4a16_copy_m16"],
                  why),
        _at_least("W4A16 M = 2048: speed vs torch BF16", big_w4, 1 / t["w4a16_vs_bf16_m2048"],
                  why, "x"),
        _at_least("FP8-block M <= 64: speed vs _scaled_mm rowwise",
                  vs_scaled([r for r in fp8 if r["m"] <= 64]), t["fp8_vs_scaled_mm_m64"], why,
                  "x"),
        _at_least("FP8-block M = 2048: speed vs _scaled_mm rowwise",
                  vs_scaled([r for r in fp8 if r["m"] >= 2048]), t["fp8_vs_scaled_mm_m2048"],
                  why, "x"),
        _at_least("fused MoE T = 64: INT4 speed vs BF16 experts", moe_ratio,
                  t["moe_int4_vs_bf16_t64"], why, "x"),
    ]  # fmt: skip


def step_verdicts(result: dict, t: dict) -> list[dict]:
    why = _reason(result, "e2e")
    rows = [r for r in result.get("e2e") or [] if isinstance(r, dict) and "decode_tok_s" in r]
    # The default path: graphs where they run; the eager Triton run is the comparison.
    rate = {(r["model"], r["backend"], r["kv"]): r["decode_tok_s"]
            for r in rows if r.get("graphs", True) or r["backend"] != "triton"}  # fmt: skip
    eager = {r["model"]: r["decode_tok_s"] for r in rows
             if r["backend"] == "triton" and r["kv"] == "fp8_e4m3" and r.get("graphs") is False}  # fmt: skip
    graph_gain = [rate[m, "triton", "fp8_e4m3"] / v for m, v in eager.items()
                  if (m, "triton", "fp8_e4m3") in rate]  # fmt: skip
    same = [r["tokens_equal_to_eager"] for r in rows if "tokens_equal_to_eager" in r]
    glm = [v for (m, b, kv), v in rate.items() if (m, b, kv) == ("glm4_moe", "triton", "fp8_e4m3")]
    fp8_vs_bf16 = [rate[m, "triton", "fp8_e4m3"] / rate[m, "triton", "bf16"]
                   for m in ("glm4_moe", "kimi")
                   if (m, "triton", "fp8_e4m3") in rate and (m, "triton", "bf16") in rate]  # fmt: skip
    profile = result.get("profile") if isinstance(result.get("profile"), dict) else {}
    busy = [profile["gpu_busy"]] if "gpu_busy" in profile else []
    busy_row = _at_least("decode step: GPU busy share", busy, t["gpu_busy"],
                         _reason(result, "profile"))  # fmt: skip
    if "launches_per_step" in profile:
        busy_row["note"] = f"{profile['launches_per_step']:.0f} host launch calls per step"
    gain_row = _at_least("CUDA graphs vs eager decode (FP8 KV)", graph_gain, 1.0, why, "x")
    if same:
        gain_row["note"] = "greedy tokens equal to eager: " + ", ".join(same)
    return [
        _at_least("GLM-MoE batch 32: decode tokens/s", glm, t["e2e_glm_tok_s"], why, " tok/s"),
        _at_least("end to end: FP8 KV vs BF16 KV", fp8_vs_bf16, 1.0, why, "x"),
        gain_row,
        busy_row,
    ]


def verdicts(result: dict, targets: dict | None = None) -> list[dict]:
    targets = TARGETS if targets is None else targets
    quant = result.get("quant") if isinstance(result.get("quant"), dict) else {}
    layer_ops = result.get("layer_ops") if isinstance(result.get("layer_ops"), dict) else {}
    graphs = result.get("graphs") if isinstance(result.get("graphs"), dict) else {}
    correctness = result.get("correctness")
    correctness = correctness if isinstance(correctness, list) else None
    return [
        _passed(result, "compile", "every kernel compiles for sm_90, no spills"),
        _passed(result, "tests", "Triton/GPU-kernel tests on CUDA"),
        _checks(correctness, "attention kernels vs torch", _reason(result, "correctness")),
        _checks(quant.get("checks"), "quantized kernels vs torch", _reason(result, "quant")),
        _checks(
            layer_ops.get("checks"),
            "layer ops (norm, SwiGLU, rotary) vs torch",
            _reason(result, "layer_ops"),
        ),
        _checks(
            graphs.get("checks"),
            "CUDA-graph decode vs eager (logits, traffic tokens)",
            _reason(result, "graphs"),
        ),
        *attention_verdicts(result, targets),
        *gemm_verdicts(result, targets),
        *step_verdicts(result, targets),
    ]


def verdict_table(result: dict) -> str:
    rows = result.get("verdicts") or verdicts(result)
    word = {True: "met", False: "NOT MET", None: "not measured"}
    width = max(len(r["target"]) for r in rows)
    lines = [f"gpu_check --quick on {result.get('env', {}).get('device', '?')}, "
             f"{result.get('elapsed_s', 0):.0f} s"]  # fmt: skip
    for r in rows:
        note = f"  ({r['note']})" if r["note"] else ""
        lines.append(f"{r['target']:<{width}}  {word[r['met']]:<12} {r['measured']}{note}")
    counts = {key: sum(1 for r in rows if r["met"] is key) for key in (True, False, None)}
    lines.append(f"targets: {counts[True]} met, {counts[False]} not met, "
                 f"{counts[None]} not measured")  # fmt: skip
    return "\n".join(lines)
