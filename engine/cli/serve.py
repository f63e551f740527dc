"""`serve`: the model over the OpenAI-, Anthropic- and Responses-compatible HTTP API."""

from __future__ import annotations

import logging

import typer

from engine.cli.common import MODEL_HELP, fail


def serve(
    model: str = typer.Option("smollm2-135m-instruct", "--model", "-m", help=MODEL_HELP),
    host: str = typer.Option("127.0.0.1", help="Address to bind; non-loopback needs an API key."),
    port: int = typer.Option(8000, help="TCP port."),
    dtype: str = typer.Option("auto", help="auto, bfloat16 or float32"),
    kv_cache_dtype: str = typer.Option("fp8_e4m3", help="auto, bf16 or fp8_e4m3"),
    kv_rotation: str = typer.Option(
        "auto",
        help="Hadamard rotation of K/V before the FP8 cache: none, hadamard, or auto "
        "(hadamard for fp8_e4m3 unless fixed KV scales were measured without rotation).",
    ),
    kv_scales: str = typer.Option(
        None,
        "--kv-scales",
        help="JSON file of KV scales (write one with `resident models calibrate`).",
    ),
    kv_scales_per_head: bool = typer.Option(
        False, "--kv-scales-per-head", help="Calibrate one FP8 scale per KV head, not per layer."
    ),
    api_key: str = typer.Option(
        None, envvar="RESIDENT_API_KEY", help="Require `Authorization: Bearer KEY`."
    ),
    max_num_seqs: int = typer.Option(None, help="Sequences in the running batch."),
    max_waiting: int = typer.Option(1024, help="Queued requests beyond which the server says 503."),
    kv_memory: float = typer.Option(None, help="KV cache budget in GiB."),
    deterministic: bool = typer.Option(False, help="Batch- and cache-invariant outputs (slower)."),
    max_model_len: int = typer.Option(None, help="Longest prompt plus output per request."),
    attention_backend: str = typer.Option(
        "auto",
        help="auto (triton on CUDA, else cpu where its C kernels run, else torch), torch, "
        "cpu or triton",
    ),
    cpu_kernel: str = typer.Option(
        "auto",
        help="CPU products with 4-/8-bit grid weights: int8 activations (AVX-512 VNNI "
        "kernel, fastest), bf16 (torch's int4 kernel), or auto (int8 where it runs).",
    ),
    kv_disk: bool = typer.Option(
        True,
        "--kv-disk/--no-kv-disk",
        help="Keep cached prefixes' KV on disk: saved when the server stops, restored "
        "when it starts (`resident cache list|clear`).",
    ),
    kv_host_gib: float = typer.Option(
        None,
        min=0,
        help="Host memory (GiB) for KV pages of pinned prefixes that give way when the "
        "pool is full; they come back from there instead of being prefilled. 0 turns it "
        "off. Default: min(8, a quarter of RAM) with a GPU pool; off on CPU, where pages "
        "spill to the disk tier.",
    ),
    speculative: str = typer.Option(
        "none",
        help="Speculative decoding: prompt_lookup (drafts copied from "
        "the context, verified in one pass; same outputs) or none. A request's "
        "`speculative` field overrides it.",
    ),
    tp: int = typer.Option(
        1,
        "--tp",
        help="Tensor-parallel ranks: one process per GPU (on CPU, processes splitting the "
        "cores). This process is rank 0 and starts the others of its node.",
    ),
    ep: bool = typer.Option(
        False, "--ep", help="MoE: deal routed experts whole to the ranks (expert parallel)."
    ),
    nnodes: int = typer.Option(1, help="Nodes the --tp ranks are spread over (evenly)."),
    node_rank: int = typer.Option(
        0, help="This node's index; nodes other than 0 run workers only, no HTTP server."
    ),
    master_addr: str = typer.Option(
        "127.0.0.1", help="Address of node 0, where the ranks meet (TCP rendezvous)."
    ),
    master_port: int = typer.Option(
        None, help="Port of the rendezvous on node 0; required with --nnodes > 1."
    ),
) -> None:
    """Serve the model over HTTP: OpenAI chat and completions, Responses, Anthropic Messages."""
    from engine.errors import EngineError
    from engine.server.launch import ServeOptions, ServeUsageError, check_options
    from engine.server.launch import serve as run_server

    logging.getLogger("resident.serve").setLevel(logging.INFO)
    options = ServeOptions(
        model=model,
        host=host,
        port=port,
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        kv_rotation=kv_rotation,
        kv_scales_file=kv_scales,
        kv_scales_per_head=kv_scales_per_head,
        api_key=api_key,
        max_num_seqs=max_num_seqs,
        max_waiting=max_waiting,
        kv_memory_gib=kv_memory,
        deterministic=deterministic,
        max_model_len=max_model_len,
        attention_backend=attention_backend,
        cpu_kernel=cpu_kernel,
        kv_disk=kv_disk,
        kv_host_gib=kv_host_gib,
        speculative=speculative,
        tensor_parallel_size=tp,
        expert_parallel=ep,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
    )
    try:
        check_options(options)
    except ServeUsageError as err:
        fail(str(err), code=2)
    try:
        code = run_server(options)
    except ServeUsageError as err:  # e.g. the port is taken
        fail(str(err), code=2)
    except (EngineError, ValueError) as err:
        fail(str(err))
    if code:
        raise typer.Exit(code)
