"""`resident bench families`: Resident against llama.cpp on the served families at
realistic size (issue 37, DESIGN.md section 9).

For each family, a random-weight checkpoint of its real shapes at 1-2B
parameters, on the Q4_1 grid, and llama.cpp's Q4_1 GGUF of it
(family_files.py): both engines hold the same values. Resident reads the
folder (or, with `resident_source="gguf"`, the GGUF file); llama.cpp the GGUF.

Figures (sizes in family_runs.SIZES; how each side measures them in
families_resident.py and families_llama_cpp.py):
- one_stream: decode tokens/s of one sequence, 128 tokens after 512;
- batch16: decode tokens/s of 16 sequences at once (512 + 128 each);
- prefill: prompt tokens/s of one 2,048-token prompt;
- long_context: decode tokens/s after an 8,192-token prompt, Resident's FP8
  KV against llama.cpp's q8_0 K and V;
- load: a fresh server process to its first token, and its peak RSS then,
  also as a multiple of the GGUF file's size;
- long_decode (only when asked for): Resident alone, decode after 8k, 16k and
  32k tokens (`contexts`), the families side by side (long_decode.py).
Each engine runs in processes of its own on the same thread count; EOS is
ignored. Rounds interleave the engines (for each figure, Resident then
llama.cpp), so a machine that drifts slows both alike; the best of the
rounds is kept and the ratio printed as Resident / llama.cpp (above 1:
Resident decodes faster, or loads slower, or holds more).

Single-stream decode is memory-bound, so it is also given as bytes read per
token (decode_bytes.py: the active weights at the size each engine holds them)
and as the share of this machine's read and copy bandwidth each engine reaches (the
read bandwidth is the ceiling: a decode reads its weights and writes next to nothing).

Without llama.cpp (neither `--llama-cpp` nor RESIDENT_LLAMA_CPP, or no
converter or binaries there, or a conversion that fails) Resident is measured
alone and the result says why the peer was not. Resident reads the checkpoint
folder of a family whose GGUF architecture it does not read (glm5's glm-dsa,
kimi_linear's kimi-linear): its Q4_1-grid weights are packed at load, the
values llama.cpp's Q4_1 file holds.
"""

from __future__ import annotations

import platform
from pathlib import Path

import httpx

from engine.devtools.benchmarks.decode_bytes import (
    copy_bandwidth,
    gguf_decode_bytes,
    last_level_cache_bytes,
    read_bandwidth,
)
from engine.devtools.benchmarks.families_llama_cpp import LlamaCppSide
from engine.devtools.benchmarks.families_resident import ResidentSide
from engine.devtools.benchmarks.family_files import (
    PEER_BINARIES,
    QUANT,
    QUANTS,
    FamilyFiles,
    default_workdir,
    locate_llama_cpp,
    prepare_family,
)
from engine.devtools.benchmarks.family_runs import (
    DEFAULT_FIGURES,
    FIGURES_WITHOUT_PEER,
    SIZES,
)
from engine.devtools.benchmarks.long_decode import DEFAULT_CONTEXTS
from engine.devtools.benchmarks.long_decode import FIGURE as LONG_DECODE_FIGURE
from engine.devtools.benchmarks.long_decode import best as long_decode_best
from engine.devtools.benchmarks.long_decode import family_lines as long_decode_rows
from engine.devtools.benchmarks.long_decode import table_lines as long_decode_table

# What Resident loads: "auto" is llama.cpp's GGUF file when there is one (both engines
# then read the same file), the checkpoint folder otherwise.
RESIDENT_SOURCES = ("auto", "folder", "gguf")
RATE_FIGURES = ("one_stream", "batch16", "prefill", "long_context")


def _best(figure: str, samples: list[dict]) -> dict:
    """The best of a figure's rounds (module docstring), with every round's samples."""
    if not samples:
        return {}
    if figure == LONG_DECODE_FIGURE:
        return long_decode_best(samples)
    if figure == "batch16" and "whole_s" in samples[0]:
        # llama-server's whole runs (no llama-batched-bench): the decode is the difference
        first = min(s["first_s"] for s in samples)
        whole = min(s["whole_s"] for s in samples)
        size = SIZES["batch16"]
        decoded = size["sequences"] * size["new"]
        rate = decoded / (whole - first) if whole > first else None
        return {"tok_s": rate, "first_s": first, "whole_s": whole, "samples": samples}
    if figure == "load":
        # Resident's first start ever calibrates and caches its FP8 KV scales: the
        # figure is the starts after it, the first one reported beside it.
        first = [s for s in samples if s.get("first_start")]
        later = [s for s in samples if not s.get("first_start")] or samples
        peaks = [s["peak_rss_bytes"] for s in later if s["peak_rss_bytes"] is not None]
        best = {
            "load_s": min(s["load_s"] for s in later),
            "peak_rss_bytes": max(peaks, default=None),
            "samples": samples,
        }
        if first and later is not samples:
            best["first_start_load_s"] = first[0]["load_s"]
            best["first_start_peak_rss_bytes"] = first[0]["peak_rss_bytes"]
        return best
    return {"tok_s": max(s["tok_s"] for s in samples), "samples": [s["tok_s"] for s in samples]}


def _ratios(resident: dict, peer: dict) -> dict:
    ratios = {}
    for figure in RATE_FIGURES:
        ours, theirs = resident.get(figure, {}).get("tok_s"), peer.get(figure, {}).get("tok_s")
        if ours and theirs:
            ratios[figure] = round(ours / theirs, 3)
    ours, theirs = resident.get("load", {}), peer.get("load", {})
    for key in ("load_s", "peak_rss_bytes"):
        if ours.get(key) and theirs.get(key):
            ratios[f"load_{key}"] = round(ours[key] / theirs[key], 3)
    return ratios


def _summary(figures, samples: dict, facts: dict, gguf_bytes: int | None, bandwidth: dict):
    summary = {figure: _best(figure, samples[figure]) for figure in figures}
    summary = {figure: best for figure, best in summary.items() if best}
    summary.update(facts)
    load = summary.get("load")
    if load and gguf_bytes:
        load["peak_rss_over_gguf"] = round(load["peak_rss_bytes"] / gguf_bytes, 3)
    rate = summary.get("one_stream", {}).get("tok_s")
    if rate and summary.get("decode_bytes"):
        summary["decode_bytes_s"] = summary["decode_bytes"] * rate
        for kind in ("read", "copy"):
            share = summary["decode_bytes_s"] / bandwidth[f"{kind}_bandwidth_bytes_s"]
            summary[f"{kind}_bandwidth_share"] = round(share, 3)
    return summary


def _measure(sides: list, figures: tuple[str, ...], rounds: int) -> tuple[dict, dict]:
    """Every side's samples per figure, rounds interleaved; a peer's failed figure is
    recorded and not asked again (Resident's failures are errors)."""
    samples = {side.name: {figure: [] for figure in figures} for side in sides}
    errors: dict[str, dict[str, str]] = {side.name: {} for side in sides}
    for round_index in range(rounds):
        for figure in figures:
            for side in sides:
                if figure in errors[side.name]:
                    continue
                if figure in FIGURES_WITHOUT_PEER and not isinstance(side, ResidentSide):
                    continue
                try:
                    samples[side.name][figure].append(side.measure(figure, round_index))
                except (RuntimeError, OSError, ValueError, httpx.HTTPError) as err:
                    if isinstance(side, ResidentSide):
                        raise
                    errors[side.name][figure] = str(err)[-2000:]
    return samples, errors


def _resident_source(files: FamilyFiles, source: str) -> str:
    if source == "gguf" and files.gguf is None:
        raise ValueError(f"--resident-source gguf needs llama.cpp's GGUF: {files.why_no_gguf}")
    if source == "gguf" and not files.resident_reads_gguf:
        raise ValueError(f"--resident-source gguf: Resident does not read {files.family}'s GGUF")
    if source == "auto":
        return "gguf" if files.gguf is not None and files.resident_reads_gguf else "folder"
    return source


def _family(
    files: FamilyFiles,
    figures,
    rounds,
    source,
    threads,
    llama_cpp,
    peer_reason,
    bandwidth,
    contexts,
):
    described = files.describe()
    source = _resident_source(files, source)
    model = str(files.gguf if source == "gguf" else files.folder)
    sides: list = [ResidentSide(model, threads, *files.routing(), contexts=contexts)]
    peer: dict = {"measured": False, "reason": peer_reason or files.why_no_gguf}
    if files.gguf is not None and peer_reason is None:
        try:
            sides.append(LlamaCppSide(llama_cpp, files.gguf, threads))
            peer = {"measured": True}
        except RuntimeError as err:
            peer["reason"] = f"llama-bench does not run on the GGUF: {str(err)[-1000:]}"
    try:
        samples, errors = _measure(sides, figures, rounds)
    finally:
        facts = {side.name: side.close() for side in sides}
    gguf_bytes = described["gguf"]["bytes"] if described["gguf"] else None
    resident = _summary(figures, samples["resident"], facts["resident"], gguf_bytes, bandwidth)
    described["resident"] = {"source": source, **resident}
    if peer["measured"]:
        facts["llama_cpp"]["decode_bytes"] = gguf_decode_bytes(files.gguf)
        theirs = _summary(figures, samples["llama_cpp"], facts["llama_cpp"], gguf_bytes, bandwidth)
        described["llama_cpp"] = {**peer, **theirs, "errors": errors["llama_cpp"]}
        described["resident_over_llama_cpp"] = _ratios(resident, theirs)
    else:
        described["llama_cpp"] = peer
    return described


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_families(
    families: tuple[str, ...],
    layers: int | None = None,
    rounds: int = 3,
    llama_cpp_dir: str | None = None,
    workdir: Path | None = None,
    figures: tuple[str, ...] = DEFAULT_FIGURES,
    resident_source: str = "auto",
    threads: int = 2,
    on_family=None,
    quant: str = QUANT,
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS,
) -> dict:
    """Both engines on each family; `on_family(result, family)` is called as each family
    finishes (a long run shows what it measured before it ends)."""
    from engine.devtools.benchmarks import long_decode
    from engine.devtools.benchmarks.serving_paths import machine

    if quant not in QUANTS:
        raise ValueError(f"quant {quant!r}: choose one of {', '.join(QUANTS)}")
    if resident_source not in RESIDENT_SOURCES:
        raise ValueError(
            f"resident source {resident_source!r}: choose one of {', '.join(RESIDENT_SOURCES)}"
        )
    if LONG_DECODE_FIGURE in figures:
        long_decode.check_contexts(families, layers, contexts)
    workdir = Path(workdir) if workdir is not None else default_workdir()
    llama_cpp, why_not = locate_llama_cpp(llama_cpp_dir)
    peer_reason = why_not
    if llama_cpp is not None and llama_cpp.lacking(PEER_BINARIES):
        missing = ", ".join(llama_cpp.lacking(PEER_BINARIES))
        peer_reason = f"{llama_cpp.binary('')} lacks {missing}"
    # Before any engine runs: the machine at its quietest.
    bandwidth = {
        "read_bandwidth_bytes_s": read_bandwidth(threads),
        "copy_bandwidth_bytes_s": copy_bandwidth(threads),
    }
    result = {
        "benchmark": "families",
        "figures": list(figures),
        "sizes": {
            figure: long_decode.sizes(contexts) if figure == LONG_DECODE_FIGURE else SIZES[figure]
            for figure in figures
        },
        "rounds": rounds,
        "threads": threads,
        "layers": layers,
        "resident_source": resident_source,
        "quant": quant,
        "workdir": str(workdir),
        "machine": {
            **machine(),
            "cpu_model": _cpu_model(),
            "last_level_cache_bytes": last_level_cache_bytes(),
            **bandwidth,
        },
        "llama_cpp": {"dir": str(llama_cpp.root) if llama_cpp else llama_cpp_dir},
        "families": {},
    }
    for family in families:
        files = prepare_family(family, layers, workdir, llama_cpp, why_not, threads, quant)
        result["families"][family] = _family(
            files,
            figures,
            rounds,
            resident_source,
            threads,
            llama_cpp,
            peer_reason,
            bandwidth,
            contexts,
        )
        if LONG_DECODE_FIGURE in figures:
            result[LONG_DECODE_FIGURE] = long_decode.compare(result)
        if on_family is not None:
            on_family(result, family)
    return result


def _value(summary: dict, figure: str, key: str):
    return summary.get(figure, {}).get(key) if figure else summary.get(key)


# (label, figure or None for a fact, key, scale, format, ratio key)
_ROWS = (
    ("1 stream decode tok/s", "one_stream", "tok_s", 1, "{:.1f}", "one_stream"),
    ("16 at once decode tok/s", "batch16", "tok_s", 1, "{:.1f}", "batch16"),
    ("prefill 2048 tok/s", "prefill", "tok_s", 1, "{:.1f}", "prefill"),
    ("decode after 8192 tok/s", "long_context", "tok_s", 1, "{:.1f}", "long_context"),
    ("load to 1st token s", "load", "load_s", 1, "{:.2f}", "load_load_s"),
    ("first start ever s", "load", "first_start_load_s", 1, "{:.2f}", None),
    ("peak RSS at load MiB", "load", "peak_rss_bytes", 2**-20, "{:.0f}", "load_peak_rss_bytes"),
    ("first start peak MiB", "load", "first_start_peak_rss_bytes", 2**-20, "{:.0f}", None),
    ("peak RSS / GGUF size", "load", "peak_rss_over_gguf", 1, "{:.2f}", None),
    ("decode MB read/token", None, "decode_bytes", 1e-6, "{:.1f}", None),
    ("share of read bandwidth", None, "read_bandwidth_share", 100, "{:.0f}%", None),
    ("share of copy bandwidth", None, "copy_bandwidth_share", 100, "{:.0f}%", None),
)


def _cell(summary: dict, figure: str | None, key: str, scale: float, form: str) -> str:
    value = _value(summary, figure, key)
    return "-" if value is None else form.format(value * scale)


def _family_lines(family: str, measured: dict) -> list[str]:
    gguf = measured["gguf"]
    head = (
        f"{family}: {measured['layers']} layers, {measured['params'] / 1e9:.2f}B params, "
        f"{measured['active_params'] / 1e9:.2f}B active per token; "
    )
    if gguf:
        types = ", ".join(f"{name} {count}" for name, count in gguf["tensor_types"].items())
        head += f"GGUF {gguf['bytes'] / 2**20:.0f} MiB ({types})"
    else:
        head += f"no GGUF: {measured['why_no_gguf']}"
    lines = [head, f"  {'':26}{'Resident':>12}{'llama.cpp':>12}{'ratio':>8}"]
    ours, theirs = measured["resident"], measured["llama_cpp"]
    ratios = measured.get("resident_over_llama_cpp", {})
    for label, figure, key, scale, form, ratio_key in _ROWS:
        if figure and figure not in ours and figure not in theirs:
            continue
        ratio = ratios.get(ratio_key) if ratio_key else None
        lines.append(
            f"  {label:26}{_cell(ours, figure, key, scale, form):>12}"
            f"{_cell(theirs, figure, key, scale, form):>12}"
            f"{'-' if ratio is None else f'{ratio:.2f}':>8}"
        )
    if not theirs.get("measured"):
        lines.append(f"  llama.cpp not measured: {theirs['reason']}")
    for figure, error in theirs.get("errors", {}).items():
        lines.append(f"  llama.cpp {figure} failed: {error.splitlines()[-1] if error else ''}")
    if theirs.get("repack") is False:
        lines.append("  llama.cpp ran without its extra buffer types (--repack 0): they crashed")
    return lines


def _read_bandwidth(machine: dict) -> str:
    read = machine.get("read_bandwidth_bytes_s")  # results from before it was measured lack it
    return f"read bandwidth {read / 1e9:.1f} GB/s, " if read else ""


def header_lines(result: dict) -> list[str]:
    machine = result["machine"]
    return [
        f"resident bench families: best of {result['rounds']} interleaved rounds, "
        f"{result['threads']} threads, {result.get('quant', QUANT)} files, Resident from the "
        f"{result['resident_source']}; ratio = Resident / llama.cpp",
        f"{machine['cpu_model']}, {machine['cores']} cores, {machine.get('cpu_matrix_isa')}; "
        f"{_read_bandwidth(machine)}copy bandwidth "
        f"{machine['copy_bandwidth_bytes_s'] / 1e9:.1f} GB/s (read + write)",
    ]


def family_block(result: dict, family: str) -> list[str]:
    """One family's table lines (after a blank line)."""
    measured = result["families"][family]
    llc = result["machine"].get("last_level_cache_bytes")
    lines = ["", *_family_lines(family, measured), *long_decode_rows(measured)]
    read = measured["resident"].get("decode_bytes")
    if llc and read and read < llc:
        lines.append(
            f"  the weights a token reads fit in the {llc / 2**20:.0f} MiB last-level cache: "
            "the bandwidth share can pass 100%"
        )
    return lines


def format_table(result: dict) -> str:
    lines = header_lines(result)
    for family in result["families"]:
        lines += family_block(result, family)
    if LONG_DECODE_FIGURE in result:
        lines += long_decode_table(result[LONG_DECODE_FIGURE])
    return "\n".join(lines)
