"""Build and load the CPU kernels (the *.c files beside this one) as one shared library.

torch has no CPU kernel for some of what a decode step does: products of 4-
or 8-bit grid weights with int8 activations (the scheme llama.cpp runs its
Q4_1/Q8_0 files with), or attention that reads FP8 pages in place. These are
a few hundred lines of C, compiled once per machine with the system C
compiler into the user cache (`$XDG_CACHE_HOME/resident/kernels`) and called
through ctypes. They need Linux on x86-64 with AVX-512 (F, BW, VL) and VNNI,
or else AVX2 with FMA and F16C: the same sources then compile against
avx512_on_avx2.h, which builds each AVX-512 operation they use from AVX2
(`RESIDENT_CPU_ISA=avx2` picks that build on an AVX-512 CPU too, to check it).
Where the CPU, the compiler or the build is missing, `unavailable()` says why
and the engine keeps its torch code.

The library shares torch's OpenMP runtime (torch loads libgomp.so.1 first and
the library links the same soname) and is told torch's thread count on every
call.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCES = sorted(Path(__file__).parent.glob("*.c"))
HEADERS = sorted(Path(__file__).parent.glob("*.h"))
_COMMON_FLAGS = ["-O3", "-mfma", "-mf16c", "-fopenmp", "-fPIC", "-shared"]
# Per instruction set: the compiler's flags and the CPU flags it needs (/proc/cpuinfo's
# names). The AVX-512 build's prefill attention also needs AVX-512 BF16 (bf16_dot_products).
ISA_BUILDS = {
    "avx512": (
        ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"],
        ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "fma", "f16c"),
    ),
    "avx2": (["-mavx2", "-DRESIDENT_AVX2"], ("avx2", "fma", "f16c")),
}
ISA_ENV = "RESIDENT_CPU_ISA"
_I64, _INT, _FLOAT, _PTR = ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_void_p
# name -> argument types; every function returns int (0 = done).
_SIGNATURES = {
    # x, x_bf16, M, K, codes, scales, format, N, bias, out, out_bf16, threads
    "grid_matmul": [_PTR, _INT, _I64, _I64, _PTR, _PTR, _INT, _I64, _PTR, _PTR, _INT, _INT],
    # codes, scales, format, K, N, out (bf16), threads
    "grid_dequantize": [_PTR, _PTR, _INT, _I64, _I64, _PTR, _INT],
    # codes, scales, format, K, N, ids, count, out, out_bf16, threads
    "grid_gather_rows": [_PTR, _PTR, _INT, _I64, _I64, _PTR, _I64, _PTR, _INT, _INT],
    # routing, x, T, hidden, ids, weights, threads
    "moe_route": [_PTR, _PTR, _I64, _I64, _PTR, _PTR, _INT],
    # routing, x, T, hidden, intermediate, experts, gate_up_format, down_format, shared
    # gate_up, shared down, shared intermediate, out, threads
    "moe_block": [_PTR, _PTR, _I64, _I64, _I64, _PTR, _INT, _INT, _PTR, _PTR, _I64, _PTR, _INT],
    # x, T, hidden, intermediate, ids, weights, top_k, experts, num_experts, gate_up_format,
    # down_format, out, threads
    "moe_experts": [
        *(_PTR, _I64, _I64, _I64, _PTR, _PTR, _I64, _PTR, _I64, _INT, _INT, _PTR, _INT)
    ],
    # x, x_bf16, M, K, packed, scales, group, N, bias, out, out_bf16, int8, threads
    "int4_matmul": [_PTR, _INT, _I64, _I64, _PTR, _PTR, _I64, _I64, _PTR, _PTR, _INT, _INT, _INT],
    # x, x_bf16, M, K, weight, scales, blocks, col_offset, block_cols, scale_rows, N, bias,
    # out, out_bf16, threads
    "fp8_block_matmul": [
        *(_PTR, _INT, _I64, _I64, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _PTR, _PTR),
        *(_INT, _INT),
    ],
    # weight, scales, rows, K, blocks, col_offset, block_cols, scale_rows, out, out_bf16,
    # threads
    "fp8_block_dequantize": [_PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _I64, _PTR, _INT, _INT],
    # q, q_bf16, kv, kv_kind, slots, lens, B, L, Hq, Hkv, D, k_scale, v_scale,
    # softmax_scale, out, out_bf16, threads
    "paged_decode": [
        *(_PTR, _INT, _PTR, _INT, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _PTR, _PTR),
        *(_FLOAT, _PTR, _INT, _INT),
    ],
    # q, kv, kv_kind, slots, lens, q_starts, q_lens, B, L, Hq, Hkv, D, k_factor,
    # v_factor, softmax_scale, out, threads
    "paged_prefill": [
        *(_PTR, _PTR, _INT, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _PTR, _PTR),
        *(_FLOAT, _PTR, _INT),
    ],
    # q_nope, q_rope, nope strides (b, h), rope strides (b, h), bf16, kv_b, rows, kv_kind,
    # slots, lens, B, L, H, nope, rope, v, r, latent_factor, rope_factor, softmax_scale,
    # out, threads
    "mla_decode": [
        *(_PTR, _PTR, _I64, _I64, _I64, _I64, _INT, _PTR, _PTR, _INT, _PTR, _PTR),
        *(_I64, _I64, _I64, _I64, _I64, _I64, _I64, _FLOAT, _FLOAT, _FLOAT, _PTR, _INT),
    ],
    # q_nope, q_rope, nope strides (b, h), rope strides (b, h), bf16, k_b codes, scales,
    # format, v_b codes, scales, format, gain, block, rows, kv_kind, slots, lens, B, L, H,
    # nope, rope, v, r, latent_factor, rope_factor, softmax_scale, out, threads
    "mla_decode_grid": [
        *(_PTR, _PTR, _I64, _I64, _I64, _I64, _INT, _PTR, _PTR, _INT, _PTR, _PTR, _INT),
        *(_PTR, _I64, _PTR, _INT, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _I64, _I64),
        *(_FLOAT, _FLOAT, _FLOAT, _PTR, _INT),
    ],
    # k, v, in_bf16, tokens, heads, D, k_stride, v_stride, slots, storage, kind,
    # k_scale, v_scale, threads
    "kv_write": [
        *(_PTR, _PTR, _INT, _I64, _I64, _I64, _I64, _I64, _PTR, _PTR, _INT, _PTR, _PTR, _INT)
    ],
    # model, layers, count, x, tokens, positions, slot_mapping, context_slots,
    # context_len, lens, threads
    "decode_layers": [_PTR, _PTR, _I64, _PTR, _I64, _PTR, _PTR, _PTR, _I64, _PTR, _INT],
    # model, layers, count, x, tokens, positions, slot_mapping, context_slots,
    # context_len, lens, mlp_width, threads
    "decode_mla_layers": [_PTR, _PTR, _I64, _PTR, _I64, _PTR, _PTR, _PTR, _I64, _PTR, _I64, _INT],
    # src, row_index, first_row, n, row_bytes, groups, type, codes, scales, dst_row0,
    # dst_bits, threads
    "gguf_grid_repack": [_PTR, _PTR, _I64, _I64, _I64, _I64, _INT, _PTR, _PTR, _I64, _INT, _INT],
    # src, row_index, first_row, n, row_bytes, supers, type, codes, scales, dst_row0, threads
    "gguf_kquant_repack": [_PTR, _PTR, _I64, _I64, _I64, _I64, _INT, _PTR, _PTR, _I64, _INT],
    # x, rows, cols, out, threads
    "argmax_rows": [_PTR, _I64, _I64, _PTR, _INT],
    # x, residual, weight, eps, out, rows, hidden, threads
    "rms_norm": [_PTR, _PTR, _PTR, _FLOAT, _PTR, _I64, _I64, _INT],
    # gate_up, out, rows, width, threads
    "silu_mul": [_PTR, _PTR, _I64, _I64, _INT],
    # x, rows, dim, stride, block, gain (float32 [dim] or NULL), threads
    "hadamard": [_PTR, _I64, _I64, _I64, _I64, _PTR, _INT],
    "hadamard_f32": [_PTR, _I64, _I64, _I64, _I64, _PTR, _INT],
    # x, tokens, heads, head_dim, stride, positions, cos, sin, rot_dim, interleaved, threads
    "rope": [_PTR, _I64, _I64, _I64, _I64, _PTR, _PTR, _PTR, _I64, _INT, _INT],
}


def kernels_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "resident" / "kernels"


def has_cpu_flag(flag: str) -> bool:
    """Whether /proc/cpuinfo lists `flag` (for kernels beyond the required set)."""
    return flag in _cpu_flags()


@functools.cache
def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _isa() -> tuple[str | None, str]:
    """The build this CPU runs (AVX-512 first), or None and what it lacks."""
    wanted = os.environ.get(ISA_ENV, "")
    if wanted and wanted not in ISA_BUILDS:
        return None, f"{ISA_ENV}={wanted} is not one of {', '.join(ISA_BUILDS)}"
    lacking = ""
    for isa, (_, cpu_flags) in ISA_BUILDS.items():
        if wanted and isa != wanted:
            continue
        missing = [flag for flag in cpu_flags if flag not in _cpu_flags()]
        if not missing:
            return isa, ""
        lacking = lacking or ", ".join(missing)
    return None, f"the CPU lacks {lacking}"


def _build(compiler: str, isa: str) -> Path:
    """Compile once per sources, flags and compiler; reuse the cached library."""
    flags = _COMMON_FLAGS + ISA_BUILDS[isa][0]
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, check=False
    ).stdout
    digest = hashlib.sha256(" ".join(flags).encode() + version.encode())
    for source in SOURCES + HEADERS:
        digest.update(source.name.encode() + source.read_bytes())
    target = kernels_dir() / f"resident-cpu-{digest.hexdigest()[:16]}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename, so concurrent engines never load half a file.
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        result = subprocess.run(
            [compiler, *flags, "-o", str(built), *map(str, SOURCES)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise OSError(f"{compiler} failed: {result.stderr.strip()[-500:]}")
        os.replace(built, target)
    return target


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str]:
    if os.environ.get("RESIDENT_CPU_KERNELS", "1") == "0":
        return None, "RESIDENT_CPU_KERNELS=0"
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None, f"needs Linux on x86-64 (this is {platform.system()} {platform.machine()})"
    isa, missing = _isa()
    if isa is None:
        return None, missing
    compiler = _compiler()
    if compiler is None:
        return None, "no C compiler (cc or gcc) on PATH"
    try:
        return open_library(_build(compiler, isa)), ""
    except OSError as error:
        return None, f"building the CPU kernels failed: {error}"


def open_library(path: str | Path) -> ctypes.CDLL:
    """A built kernel library at `path`, its functions' signatures set (also how
    bench/cpu_kernels_ab.py opens a second build beside this one)."""
    library = ctypes.CDLL(str(path))
    for name, argtypes in _SIGNATURES.items():
        function = getattr(library, name)
        function.restype = ctypes.c_int
        function.argtypes = argtypes
    return library


def library_path() -> str:
    """Where the loaded kernel library lives (the user cache, named by its sources' hash)."""
    return library()._name


def unavailable() -> str:
    """Why the CPU kernels cannot run here, or "" when they can."""
    return _load()[1]


@functools.cache  # as _load: fixed for the process
def isa() -> str | None:
    """The instruction set the loaded kernels were built for ("avx512", "avx2"), or None."""
    return _isa()[0] if _load()[0] is not None else None


@functools.cache  # asked by every prefill attention call (paged_prefill.prefill_supports)
def bf16_dot_products() -> bool:
    """Whether the kernels that multiply BF16 pairs (paged_prefill.c) can run: natively
    with AVX-512 BF16, or as FMAs in the AVX2 build."""
    built = isa()
    return built == "avx2" or (built == "avx512" and has_cpu_flag("avx512_bf16"))


def library() -> ctypes.CDLL:
    loaded, reason = _load()
    if loaded is None:
        raise RuntimeError(f"CPU kernels unavailable: {reason}")
    return loaded
