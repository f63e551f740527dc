"""The compile check: plan every launch, compile what the cache lacks, judge, report.

Compiles run in worker processes when there are several to do: Triton's
pipeline and ptxas are single-threaded, and on two cores two workers halve
a cold run. Workers are forked after planning and take launches by index,
so nothing unpicklable (jit functions, meta tensors) crosses a process.
"""

from __future__ import annotations

import os
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from multiprocessing import get_context

from engine.devtools.kernel_check.compiler import cache_dir, cache_key, compile_launch
from engine.devtools.kernel_check.gpus import CheckedGPU, checked_gpus
from engine.devtools.kernel_check.plan import Launch, engine_kernels, plan_launches
from engine.devtools.kernel_check.verdict import coverage_problems, make_row

_WORK: list[tuple[Launch, CheckedGPU]] = []  # what forked workers compile, by index


def _compile_at(index: int, use_cache: bool) -> dict:
    warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
    launch, gpu = _WORK[index]
    return compile_launch(launch, gpu, use_cache)


def _compile_all(work: list[tuple[Launch, CheckedGPU]], jobs: int, use_cache: bool) -> list[dict]:
    """Results in work order; cache hits are read here, misses compiled by `jobs` workers."""
    results: list[dict | None] = [None] * len(work)
    misses = []
    for index, (launch, gpu) in enumerate(work):
        cached = cache_dir() / f"{cache_key(launch, gpu)}.json" if use_cache else None
        if cached is not None and cached.exists():
            results[index] = compile_launch(launch, gpu, use_cache)
        else:
            misses.append(index)
    _WORK[:] = work
    try:
        if jobs <= 1 or len(misses) <= 1:
            for index in misses:
                results[index] = _compile_at(index, use_cache)
        else:
            workers = min(jobs, len(misses))
            with ProcessPoolExecutor(workers, mp_context=get_context("fork")) as pool:
                done = pool.map(partial(_compile_at, use_cache=use_cache), misses)
                for index, result in zip(misses, done, strict=True):
                    results[index] = result
    finally:
        _WORK.clear()
    return results


def run_check(
    gpus: list[CheckedGPU] | None = None, jobs: int | None = None, use_cache: bool = True
) -> dict:
    """Every planned launch compiled for every GPU: {"rows", "coverage", "gpus", timings}."""
    warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
    start = time.perf_counter()
    gpus = checked_gpus() if gpus is None else gpus
    jobs = (os.cpu_count() or 1) if jobs is None else jobs
    work = [(launch, gpu) for gpu in gpus for launch in plan_launches(gpu)]
    planned = time.perf_counter()
    results = _compile_all(work, jobs, use_cache)
    rows = [make_row(launch, gpu, result)
            for (launch, gpu), result in zip(work, results, strict=True)]  # fmt: skip
    coverage = []
    for gpu in gpus:
        coverage += coverage_problems([r for r in rows if r["sm"] == gpu.sm], engine_kernels())
    import triton

    return dict(
        gpus=[f"{gpu.name} {gpu.sm}" for gpu in gpus],
        triton=triton.__version__,
        rows=rows,
        coverage=coverage,
        compiled=sum(1 for r in results if not r.get("cached")),
        cached=sum(1 for r in results if r.get("cached")),
        plan_seconds=round(planned - start, 2),
        seconds=round(time.perf_counter() - start, 2),
        cache_dir=str(cache_dir()),
    )


def failed(report: dict) -> bool:
    return bool(report["coverage"]) or any(row["problems"] for row in report["rows"])
