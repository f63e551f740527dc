"""`resident bench`: measurements that print JSON (tables without --json)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import typer

from engine.cli.common import MODEL_HELP, fail, setting_option
from engine.model_files.store import DEFAULT_MODEL_NAME

bench_app = typer.Typer(help="Measurements that print JSON.", no_args_is_help=True)


@contextmanager
def _usage_errors() -> Iterator[None]:
    """A model that cannot load (a bad path, too small a KV budget) or an option out of
    range is a message and exit code 2, as for every other command, not a traceback."""
    from engine.errors import EngineError

    try:
        yield
    except (EngineError, ValueError) as err:
        fail(str(err), code=2)


@contextmanager
def _failures() -> Iterator[None]:
    """A measurement that went wrong on the way (a server or router that exited, a
    request refused) is a message and exit code 1, not a traceback."""
    try:
        yield
    except RuntimeError as err:
        fail(str(err), code=1)


@bench_app.command("throughput")
def bench_throughput(
    model: str = typer.Option(DEFAULT_MODEL_NAME, "--model", "-m", help=MODEL_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    max_tokens: int = typer.Option(128, help="Tokens generated per prompt."),
    batch: int = typer.Option(16, help="Prompts in the batched run."),
    skip_transformers: bool = typer.Option(False, help="Measure the engine only."),
    prefill_tokens: int = typer.Option(4096, min=1, help="Tokens of the cold prefill run."),
    repeats: int = typer.Option(3, min=1, help="Timed runs per figure; the best counts."),
    attention_backend: str = setting_option(
        "attention_backend", default=None, note="Default: what `resident serve` picks."
    ),
) -> None:
    """Decode tokens/s: engine (BF16 and FP8 KV) against transformers' generate."""
    from engine.devtools.benchmarks.throughput import format_table, run_throughput

    with _usage_errors():
        result = run_throughput(
            model,
            max_tokens,
            batch,
            with_transformers=not skip_transformers,
            prefill_tokens=prefill_tokens,
            repeats=repeats,
            attention_backend=attention_backend,
        )
    typer.echo(json.dumps(result, indent=2) if as_json else format_table(result))


@bench_app.command("serving")
def bench_serving(
    model: str = typer.Option(DEFAULT_MODEL_NAME, "--model", "-m", help=MODEL_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    max_tokens: int = typer.Option(128, min=1, help="Tokens generated per request (EOS ignored)."),
    concurrency: int = typer.Option(16, min=1, help="Requests at once in the concurrent run."),
    repeats: int = typer.Option(3, min=1, help="Timed runs per figure; the best counts."),
    paths: str = typer.Option(
        "library,async_engine,http,http_whole",
        help="Which of library, async_engine, http (streamed), http_whole to measure.",
    ),
    peer: str = typer.Option(
        None, help="An OpenAI-compatible server on the same model (llama-server, vLLM) to compare."
    ),
    peer_model: str = typer.Option(None, help="The model name the peer expects (its first)."),
) -> None:
    """Decode tokens/s through the library, the in-process async engine and HTTP, and a peer."""
    from engine.devtools.benchmarks.serving_paths import PATHS, format_table, run_serving

    chosen = tuple(p.strip() for p in paths.split(",") if p.strip())
    unknown = sorted(set(chosen) - set(PATHS))
    if unknown:
        fail(f"--paths: unknown {', '.join(unknown)}; choose from {', '.join(PATHS)}", code=2)
    with _usage_errors():
        result = run_serving(
            model, max_tokens, concurrency, repeats, peer=peer, peer_model=peer_model, paths=chosen
        )
    typer.echo(json.dumps(result, indent=2) if as_json else format_table(result))


@bench_app.command("accuracy")
def bench_accuracy(
    model: str = typer.Option(
        DEFAULT_MODEL_NAME, "--model", "-m", help=MODEL_HELP + " tiny:FAMILY: random."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    variants: str = typer.Option(
        "fp8_per_tensor,fp8_per_head,fp8_hadamard,bf16_hadamard",
        help="Compared with BF16 KV: fp8_per_tensor, fp8_per_head, fp8_hadamard, "
        "fp8_hadamard_per_head, bf16_hadamard.",
    ),
    contexts: str = typer.Option("2048,8192", help="Window lengths (capped at the model's)."),
    windows: str = typer.Option("6,1", help="Python-source windows per context."),
    prose_windows: str = typer.Option("2,1", help="Prose windows per context."),
    decode_tokens: int = typer.Option(32, min=0, help="Last tokens of a window run as decode."),
    calibration: str = typer.Option(
        "held-out", help="held-out (text after the scored) or first-prefill."
    ),
    calibration_tokens: int = typer.Option(1024, min=0, help="Held-out tokens per text."),
) -> None:
    """Perplexity and top-1 agreement of FP8 KV variants against BF16 KV."""
    from engine.devtools.benchmarks.accuracy import format_table, run_accuracy

    def numbers(value: str, flag: str) -> tuple[int, ...]:
        try:
            return tuple(int(part) for part in value.split(","))
        except ValueError:
            fail(f"{flag} takes comma-separated integers", code=2)

    with _usage_errors():
        result = run_accuracy(
            model,
            variants=tuple(v.strip() for v in variants.split(",") if v.strip()),
            contexts=numbers(contexts, "--contexts"),
            python_windows=numbers(windows, "--windows"),
            prose_windows=numbers(prose_windows, "--prose-windows"),
            decode_tokens=decode_tokens,
            calibration=calibration,
            calibration_tokens=calibration_tokens,
        )
    typer.echo(json.dumps(result, indent=2) if as_json else format_table(result))


@bench_app.command("prefix")
def bench_prefix(
    model: str = typer.Option(DEFAULT_MODEL_NAME, "--model", "-m", help=MODEL_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    prefix_tokens: int = typer.Option(6000, help="Tokens of the shared prefix."),
    kv_cache_dtype: str = setting_option("kv_cache_dtype"),
) -> None:
    """Time to first token with a cached shared prefix against a cold one, over HTTP."""
    from engine.devtools.benchmarks.serving import run_prefix

    with _usage_errors():
        result = run_prefix(model, prefix_tokens, kv_cache_dtype)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    ttft = result["ttft_s"]
    typer.echo(
        f"prompt {result['prompt_tokens']} tokens, {result['cached_tokens_warm']} cached: "
        f"TTFT warm {ttft['warm']:.3f}s, cold {ttft['cold']:.3f}s, "
        f"ratio {result['warm_over_cold']:.3f} (target <= {result['target_warm_over_cold']})"
    )


def _names(value: str, flag: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    chosen = tuple(part.strip() for part in value.split(",") if part.strip())
    unknown = sorted(set(chosen) - set(allowed))
    if unknown or not chosen:
        fail(
            f"{flag}: unknown {', '.join(unknown) or 'nothing'}; choose from {', '.join(allowed)}",
            2,
        )
    return chosen


@bench_app.command("families")
def bench_families(
    families: str = typer.Option(
        "llama,glm4_moe,kimi_k2",
        help="Families to measure (their realistic 1-2B shapes): llama, glm4_moe, kimi_k2, "
        "glm5, kimi_linear.",
    ),
    layers: int = typer.Option(None, min=1, help="Cut each model to N layers (quick runs)."),
    rounds: int = typer.Option(3, min=1, help="Interleaved rounds; the best of each counts."),
    llama_cpp: str = typer.Option(
        None,
        "--llama-cpp",
        help="llama.cpp's source folder (binaries in build/bin: llama-quantize, llama-bench, "
        "llama-server, and llama-batched-bench for the 16-at-once figure); default: "
        "$RESIDENT_LLAMA_CPP. Without it Resident is measured alone.",
    ),
    workdir: str = typer.Option(
        None, help="Where checkpoints and GGUF files are kept; default: the user cache."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    figures: str = typer.Option(
        "one_stream,batch16,prefill,long_context,load",
        help="Which figures to measure; also long_decode: Resident's decode after each of "
        "--contexts, the families side by side (try glm5,kimi_linear,kimi_k2).",
    ),
    contexts: str = typer.Option(
        "8192,16384,32768", help="The long_decode figure's context lengths, in tokens."
    ),
    resident_source: str = typer.Option(
        "auto",
        help="What Resident loads: llama.cpp's GGUF file (auto: when there is one, so both "
        "engines read the same file), or the checkpoint folder.",
    ),
    threads: int = typer.Option(2, min=1, help="Threads of each engine."),
    quant: str = typer.Option(
        "Q4_1",
        help="The GGUF file both engines read: Q4_1 (the checkpoint's own grids) or Q4_K_M "
        "(llama-quantize's mix, what CPU users download).",
    ),
) -> None:
    """Resident against llama.cpp on random-weight Llama, GLM-MoE, Kimi K2, GLM-5 and Kimi
    Linear models of 1-2B."""
    from pathlib import Path

    from engine.devtools.benchmarks.families import (
        RESIDENT_SOURCES,
        family_block,
        header_lines,
        run_families,
    )
    from engine.devtools.benchmarks.family_files import FAMILIES, QUANTS
    from engine.devtools.benchmarks.family_runs import FIGURES
    from engine.devtools.benchmarks.long_decode import FIGURE as LONG_DECODE
    from engine.devtools.benchmarks.long_decode import table_lines

    chosen_families = _names(families, "--families", FAMILIES)
    try:
        chosen_contexts = tuple(int(part) for part in contexts.split(",") if part.strip())
    except ValueError:
        fail(f"--contexts: give token counts separated by commas, not {contexts!r}", 2)
    chosen_figures = _names(figures, "--figures", FIGURES)
    _names(resident_source, "--resident-source", RESIDENT_SOURCES)
    _names(quant, "--quant", QUANTS)

    def show(result: dict, family: str) -> None:
        """The table grows a family at a time: a long run keeps what it measured."""
        if not as_json:
            if len(result["families"]) == 1:
                typer.echo("\n".join(header_lines(result)))
            typer.echo("\n".join(family_block(result, family)))

    with _usage_errors():
        result = run_families(
            chosen_families,
            layers=layers,
            rounds=rounds,
            llama_cpp_dir=llama_cpp,
            workdir=Path(workdir) if workdir else None,
            figures=chosen_figures,
            resident_source=resident_source,
            threads=threads,
            on_family=show,
            quant=quant,
            contexts=chosen_contexts,
        )
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    elif LONG_DECODE in result:
        typer.echo("\n".join(table_lines(result[LONG_DECODE])))


@bench_app.command("routing")
def bench_routing(
    router: str = typer.Option(
        "sglang",
        help="Routers to measure, comma-separated: sglang (pip install sglang-router), "
        "vllm (pip install vllm-router); their binaries beside this Python or on PATH.",
    ),
    policies: str = typer.Option(
        None,
        help="Policies, comma-separated (each router runs those it has); default: "
        "round_robin, cache_aware and the session-key policy (sglang manual, vllm "
        "consistent_hash), plus vllm's kv_aware (the replicas then publish KV events).",
    ),
    replicas: int = typer.Option(2, min=1, help="`resident serve` replicas behind the router."),
    model: str = typer.Option(DEFAULT_MODEL_NAME, "--model", "-m", help=MODEL_HELP),
    kv_memory: float = typer.Option(
        None,
        "--kv-memory",
        min=0.0001,
        help="KV cache per replica in GiB. Keep it below what holds every repository, or "
        "every policy hits alike and the comparison means nothing; default: one replica's "
        "share of the working set (every repository and every session's turns, over N); "
        "the output says when a replica could still hold every repository.",
    ),
    repositories: int = typer.Option(4, min=1, help="Repositories (long shared prefixes)."),
    sessions: int = typer.Option(3, min=1, help="Sessions per repository."),
    turns: int = typer.Option(4, min=1, help="Turns per session, each extending the last."),
    repository_tokens: str = typer.Option(
        "1000-2000", help="Each repository's prefix in tokens, drawn in LOW-HIGH."
    ),
    turn_tokens: int = typer.Option(120, min=8, help="Tokens a turn adds (question + answer)."),
    concurrency: int = typer.Option(4, min=1, help="Sessions in flight at once."),
    max_tokens: int = typer.Option(8, min=1, help="Tokens generated per request."),
    prompt_form: str = typer.Option(
        "chat",
        help="chat (the agent's requests), or token-ids (completions whose prompt is the "
        "chat's token ids, the template applied here; vllm-router only).",
    ),
    threads: int = typer.Option(None, min=1, help="Threads per replica; default: cores / N."),
    traffic_seed: int = typer.Option(40, help="Seed the traffic is drawn with."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Hit rate, prefill tokens and time to first token of replicas behind sglang-router or
    vllm-router, per policy, on agent-shaped traffic (repositories, sessions, turns)."""
    from engine.devtools.benchmarks.routing import (
        PROMPT_FORMS,
        ROUTERS,
        header_lines,
        policy_line,
        run_routing,
    )
    from engine.devtools.benchmarks.routing_traffic import TrafficShape

    chosen = _names(router, "--router", tuple(ROUTERS))
    _names(prompt_form, "--prompt-form", PROMPT_FORMS)
    if policies is None:
        per_router = {name: ROUTERS[name].policies for name in chosen}
    else:
        wanted = _names(
            policies, "--policies", sorted({p for r in ROUTERS.values() for p in r.accepted})
        )
        per_router = {n: tuple(p for p in wanted if p in ROUTERS[n].accepted) for n in chosen}
        per_router = {n: p for n, p in per_router.items() if p}
        if not per_router:
            fail(f"--policies: none of {', '.join(wanted)} is a policy of {router}", 2)
    # round_robin first: the others' hit rates are given as multiples of its.
    per_router = {
        n: tuple(sorted(p, key=lambda x: x != "round_robin")) for n, p in per_router.items()
    }
    low, _, high = repository_tokens.partition("-")
    try:
        span = (int(low), int(high or low))
    except ValueError:
        fail("--repository-tokens takes LOW-HIGH, e.g. 1000-2000", 2)

    def show(result: dict, name: str, policy: str) -> None:
        if not as_json:
            if sum(len(r["policies"]) for r in result["routers"].values()) == 1:
                typer.echo("\n".join(header_lines(result)))
            typer.echo(policy_line(result, name, policy))

    with _usage_errors(), _failures():
        shape = TrafficShape(repositories, sessions, turns, span, turn_tokens, traffic_seed)
        result = run_routing(
            model,
            per_router,
            replicas=replicas,
            shape=shape,
            kv_memory_gib=kv_memory,
            max_tokens=max_tokens,
            concurrency=concurrency,
            form=prompt_form,
            threads=threads,
            on_policy=show,
        )
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        for note in result["notes"]:
            typer.echo(f"note: {note}")
