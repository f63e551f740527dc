"""What fails the compile check, and the table it prints.

A launch fails when it does not compile, when it asks for more shared
memory than one block may have on the GPU, or when it spills registers to
local memory in a kernel that must not: decode attention (the merge
included), MLA decode (sparse included), the DSA indexer's scores, W4A16,
FP8-block, fused MoE, the layer ops (norms, SwiGLU, rotary) and the fused
rotary + KV write are the decode path's bandwidth-bound kernels, where a spill is a round trip to memory inside
the loop that should only stream weights, KV pages or activations.
Elsewhere a spill is reported, not failed. A
`*_kernel` in the kernel packages that no planned launch reaches fails too:
it would be a kernel nothing checks.
"""

from __future__ import annotations

from engine.devtools.kernel_check.gpus import CheckedGPU
from engine.devtools.kernel_check.plan import Launch

# Kernels that must not spill, by module (the module names the kernel's purpose).
SPILL_FREE_MODULES = {
    "engine.attention.triton.decode": "decode attention",
    "engine.attention.triton.mla_decode": "MLA decode",
    "engine.attention.triton.index_scores": "the DSA indexer's decode scores",
    "engine.gpu_kernels.w4a16": "W4A16 GEMM",
    "engine.gpu_kernels.fp8_block_gemm": "FP8-block GEMM",
    "engine.gpu_kernels.fused_moe": "fused MoE",
    "engine.gpu_kernels.layer_ops": "a layer op (norm, SwiGLU, rotary)",
    "engine.attention.triton.rope_write": "the fused rotary + K/V rotation + KV write",
}
# Launches whose point is to multiply e4m3 on tensor cores: those configured with
# FP8_DOT=True (GQA and MLA decode over FP8 pages). Compiled to anything else (Triton turns
# a dot of fewer than 64 rows into fp16 mma.sync after converting every byte), they lose
# the gain.
FP8_MMA_MARKS = ("e4m3.e4m3", "f8f6f4")  # wgmma's operand types; tcgen05's operand kind
USED_BY_KEPT = 8  # deployments listed per row in the JSON (the count is always there)


def problems(row: dict, gpu: CheckedGPU, spill_free: dict[str, str] | None = None) -> list[str]:
    """Why this compiled launch fails the check (empty: it passes)."""
    spill_free = SPILL_FREE_MODULES if spill_free is None else spill_free
    if row.get("error"):
        return [f"does not compile for {gpu.sm}: {row['error']}"]
    found = []
    if row["shared"] > gpu.shared_limit:
        found.append(
            f"needs {row['shared']:,} B of shared memory; one {gpu.name} block may use "
            f"{gpu.shared_limit:,} B ({gpu.shared_limit // 1024} KiB): smaller tiles or fewer stages"
        )
    if wants_fp8_tensor_cores(row) and "mma" in row:
        mma = row["mma"]
        if not any(mark in op for op in mma for mark in FP8_MMA_MARKS):
            found.append(
                f"multiplies {', '.join(mma) or 'without tensor cores'}, not e4m3 on tensor "
                "cores: an FP8 dot wants 64 rows (swap its operands: positions as rows)"
            )
    if row["spilled"] and row["module"] in spill_free:
        found.append(
            f"spills {row['spilled']} B per thread to local memory at {row['registers']} "
            f"registers; {spill_free[row['module']]} must not spill: smaller tiles or more warps"
        )
    return found


def wants_fp8_tensor_cores(row: dict) -> bool:
    return "FP8_DOT=True" in row.get("config", "").split()


def make_row(
    launch: Launch, gpu: CheckedGPU, result: dict, spill_free: dict[str, str] | None = None
) -> dict:
    """One line of the table: the launch, its resources (or error) and its problems."""
    row = dict(
        gpu=gpu.name,
        sm=gpu.sm,
        kernel=launch.name,
        module=launch.module,
        config=launch.config(),
        pointers=launch.pointer_dtypes(),
        uses=len(launch.used_by),
        used_by=launch.used_by[:USED_BY_KEPT],
        **result,
    )
    row["problems"] = problems(row, gpu, spill_free)
    return row


def coverage_problems(rows: list[dict], kernels: dict[str, str]) -> list[str]:
    """Kernels defined in the kernel packages that no planned launch compiled."""
    planned = {f"{row['module']}.{row['kernel']}" for row in rows}
    return [
        f"{qualified} is launched by nothing the check plans (engine/devtools/kernel_check/calls.py): "
        "add its launcher's calls there"
        for qualified in sorted(kernels)
        if qualified not in planned
    ]


def _cell(row: dict, key: str) -> str:
    value = row.get(key)
    return "-" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


def table(report: dict) -> str:
    """Rows grouped by GPU and kernel, then one verdict line per failure and the summary."""
    header = f"{'gpu':<5} {'kernel':<25} {'regs':>4} {'spill':>5} {'shared':>7}  config"
    lines = [header]
    for row in sorted(report["rows"], key=lambda r: (r["sm"], r["kernel"], r["config"])):
        status = "  FAIL" if row["problems"] else ""
        lines.append(
            f"{row['gpu']:<5} {row['kernel']:<25} {_cell(row, 'registers'):>4} "
            f"{_cell(row, 'spilled'):>5} {_cell(row, 'shared'):>7}  {row['config']}{status}"
        )
    failures = [f"FAILED {r['gpu']} {r['kernel']} [{r['config']}]: {p}"
                for r in report["rows"] for p in r["problems"]]  # fmt: skip
    failures += [f"FAILED: {p}" for p in report["coverage"]]
    lines += failures
    lines.append(summary(report))
    return "\n".join(lines)


def summary(report: dict) -> str:
    rows = report["rows"]
    bad = sum(1 for r in rows if r["problems"]) + len(report["coverage"])
    gpus = ", ".join(report["gpus"])
    timing = (f"{report['compiled']} compiled, {report['cached']} cached, "
              f"{report['seconds']:.1f} s")  # fmt: skip
    verdict = "ok" if not bad else f"{bad} FAILED"
    return f"kernel compile check ({gpus}): {len(rows)} launches {verdict} ({timing})"
