"""`resident serve`: check the options, load the engine, log what it holds, run uvicorn.

Usage errors (a non-loopback bind without an API key, a value a setting does
not take) are raised as `ServeUsageError` before anything is loaded, so the
command fails fast with exit code 2. The options themselves (ServeOptions) are
declared in engine/server/options.py, the engine settings among them derived from
EngineConfig, which also says what each setting allows.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import signal
import socket
import threading
from typing import TYPE_CHECKING

from engine.config import EngineConfig, unknown_choice
from engine.host import early_pages, start_up_collector
from engine.host.memory_advice import start_up_finished
from engine.server.options import (
    API_KEY_ENV,
    SERVE_SETTINGS,
    ServeOptions,
    flag_of,
    serve_settings,
)

if TYPE_CHECKING:
    from engine.async_engine import AsyncEngine  # torch: loaded only to serve

log = logging.getLogger("resident.serve")


class ServeUsageError(ValueError):
    """The options cannot work together; the message says what to change."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


def check_options(options: ServeOptions) -> ServeOptions:
    """Validate before loading; fills the API key from RESIDENT_API_KEY when not given."""
    if not options.api_key:
        options.api_key = os.environ.get(API_KEY_ENV) or None
    if not is_loopback(options.host) and not options.api_key:
        raise ServeUsageError(
            f"refusing to listen on {options.host} without an API key: anyone who can reach "
            f"it could use the model. Pass --api-key KEY (or set {API_KEY_ENV}), "
            "or bind to 127.0.0.1"
        )
    for name in SERVE_SETTINGS:
        message = unknown_choice(name, getattr(options, name), flag_of(name))
        if message:
            raise ServeUsageError(message)
    if options.kv_scales_file and not os.path.isfile(options.kv_scales_file):
        raise ServeUsageError(f"--kv-scales {options.kv_scales_file}: no such file")
    if not 0 < options.port < 65536:
        raise ServeUsageError(f"--port must be 1..65535, not {options.port}")
    check_parallel_options(options)
    check_settings(options)
    return options


def check_settings(options: ServeOptions) -> None:
    """What EngineConfig says of the settings (bounds, their combination), as a usage
    error that names the flag."""
    from pydantic import ValidationError

    try:
        engine_config(options)
    except ValidationError as err:
        first = err.errors()[0]
        where = first["loc"]
        flag = f"{flag_of(str(where[0]))}: " if where else ""
        shown = f", not {first['input']!r}" if where else ""
        raise ServeUsageError(f"{flag}{first['msg'].lower()}{shown}") from None


def check_parallel_options(options: ServeOptions) -> None:
    tp, nnodes, node_rank = options.tensor_parallel_size, options.nnodes, options.node_rank
    if tp < 1 or nnodes < 1:
        raise ServeUsageError("--tp and --nnodes must be at least 1")
    if tp % nnodes:
        raise ServeUsageError(
            f"--tp {tp} does not split evenly over --nnodes {nnodes}; give every node "
            "the same number of ranks"
        )
    if not 0 <= node_rank < nnodes:
        raise ServeUsageError(f"--node-rank must be 0..{nnodes - 1}, not {node_rank}")
    if nnodes > 1 and options.master_port is None:
        raise ServeUsageError(
            "--master-port is required with --nnodes > 1: every node meets node 0 at "
            "--master-addr:--master-port"
        )
    if options.master_port is not None and not 0 < options.master_port < 65536:
        raise ServeUsageError(f"--master-port must be 1..65535, not {options.master_port}")


def bind_listener(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the model loads: a port that is taken (or
    not ours to take) is an error within a second, not after minutes of loading
    weights, and nothing can take it while they load."""
    address = host.strip("[]")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # Lets a restarted server reuse the port while old connections sit in
    # TIME_WAIT; on Linux it never lets two listeners share a port.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
        sock.listen(2048)
    except OSError as err:
        sock.close()
        reason = err.strerror or str(err)
        raise ServeUsageError(
            f"cannot listen on {host}:{port}: {reason}; pick another --port or stop what holds it"
        ) from err
    return sock


def engine_config(options: ServeOptions) -> EngineConfig:
    """The EngineConfig these options ask for."""
    return EngineConfig(**serve_settings(options))


def build_engine(options: ServeOptions) -> AsyncEngine:
    """Load the model into an AsyncEngine (slow: reads the weights, allocates the KV pool)."""
    from engine.async_engine import AsyncEngine

    try:
        return AsyncEngine.open(engine_config(options))
    finally:
        early_pages.finish()  # what the CLI made early and the load did not take


def restore_prefixes(engine: AsyncEngine) -> None:
    """Load the prefixes a previous run saved, before the first request."""
    import asyncio

    tokens = asyncio.run(engine.restore_saved())
    if tokens:
        log.info("restored %d tokens of cached prefixes from the KV disk tier", tokens)


def save_prefixes(engine: AsyncEngine) -> None:
    """Save the prefixes the cache holds (pinned first) for the next run; a failure
    is logged, never raised, so stopping always completes."""
    import asyncio

    try:
        pages = asyncio.run(engine.save_cached())
    except Exception as err:  # a full disk, an engine that died
        log.warning("could not save cached prefixes to the KV disk tier: %s", err)
        return
    if pages:
        log.info("saved %d KV pages of cached prefixes to the disk tier", pages)


def _scale_values(scales: dict) -> dict[str, list]:
    """The scale lists of a stats `kv_scales` object: k/v (GQA) or latent/rope (MLA)."""
    return {key: value for key, value in scales.items() if isinstance(value, list)}


def _flat(values: list) -> list[float]:
    return [x for value in values for x in (value if isinstance(value, list) else [value])]


def describe_kv(stats: dict) -> str:
    scales = stats.get("kv_scales") or {}
    values = _scale_values(scales) or {"k": [], "v": []}

    def span(values: list) -> str:
        flat = _flat(values)
        return f"{min(flat):.4g}..{max(flat):.4g}" if flat else "n/a"

    source = scales.get("source", "n/a")
    if source == "sample":
        source = "a built-in sample at start-up (resident models calibrate: your own text)"
    if source == "calibrate":
        done, total = scales.get("calibrated_layers"), scales.get("num_layers")
        pending = total is not None and done is not None and done < total
        source = "the first prefill" + (f" ({done}/{total} layers so far)" if pending else "")
    granularity = scales.get("granularity")
    spans = ", ".join(f"{key} {span(value)}" for key, value in values.items())
    return (
        f"KV cache: {stats.get('kv_cache_dtype')}, capacity {stats.get('capacity_tokens')} tokens "
        f"({stats.get('kv_bytes_per_token')} bytes/token), max context "
        f"{stats.get('max_context_tokens')} tokens; rotation "
        f"{stats.get('kv_rotation', scales.get('rotation', 'none'))}; scales from {source}"
        f"{f' ({granularity})' if granularity else ''} ({spans})"
    )


def describe_kv_scales(stats: dict) -> list[str]:
    """One line per scale list with every value in force (the start-up log's detail)."""
    scales = stats.get("kv_scales") or {}
    pending = scales.get("calibrated_layers", 0) < scales.get("num_layers", 0)
    if scales.get("source") == "calibrate" and pending:
        return ["KV scales: set from the first prefill, then frozen (see /v1/engine/stats)"]
    lines = []
    for key, values in _scale_values(scales).items():
        shown = [
            "[" + ", ".join(f"{x:.4g}" for x in v) + "]" if isinstance(v, list) else f"{v:.4g}"
            for v in values
        ]
        lines.append(f"KV {key} scales by layer: {', '.join(shown)}")
    return lines


class _Terminated(Exception):
    """SIGTERM, passed on by uvicorn after its graceful shutdown."""


@contextlib.contextmanager
def _sigterm_ends_run():
    """uvicorn shuts down gracefully on SIGTERM and then raises the signal again with the
    handler it found, which by default ends the process on the spot: the prefixes would
    not be saved, nor the worker ranks stopped. Here that second SIGTERM ends only the
    run, and stopping continues as after Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum, frame) -> None:
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    except _Terminated:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)


def serve_node(options: ServeOptions) -> int:
    """A node other than 0: its worker ranks only, no scheduler and no HTTP server.
    Returns when they exit (0 when they all stopped cleanly)."""
    from engine.distributed import launch

    logging.getLogger(launch.__name__).setLevel(logging.INFO)  # which ranks, which pids
    return launch.run_node(engine_config(options))


def serve(options: ServeOptions) -> int:
    """Serve until stopped; returns the exit code (0, or a node's failed workers' 1)."""
    import asyncio

    import uvicorn

    from engine.server.app import KEEP_ALIVE_SECONDS, create_app
    from engine.server.served_model import ServedModel

    options = check_options(options)
    if options.node_rank > 0:
        return serve_node(options)
    listener = bind_listener(options.host, options.port)
    try:
        engine = build_engine(options)
    except BaseException:
        listener.close()
        raise
    try:
        model = ServedModel.from_engine(engine, options.model)
        stats = asyncio.run(engine.stats())
        log.info("serving %s (also as %s)", model.id, ", ".join(model.names[1:]) or "-")
        log.info("%s", describe_kv(stats))
        for line in describe_kv_scales(stats):
            log.info("%s", line)
        log.info(
            "attention backend %s; CPU grid-weight products: %s",
            stats.get("attention_backend"),
            stats.get("cpu_kernel"),
        )
        if options.deterministic:
            log.info("deterministic mode: batch- and cache-invariant reductions")
        parallel = stats.get("parallel") or {}
        if parallel.get("tp", 1) > 1:
            log.info(
                "tensor parallel %d (expert parallel %d) over %d node(s), %d ranks alive",
                parallel["tp"],
                parallel["ep"],
                parallel["nnodes"],
                parallel["ranks_alive"],
            )
            if options.kv_disk:
                log.info(
                    "the prefix disk tier (--kv-disk) is off with --tp > 1: each rank holds "
                    "its own shard of every page and would need its own files"
                )
        restore_prefixes(engine)
        app = create_app(engine, model, api_key=options.api_key)
        auth = "API key required" if options.api_key else "no API key"
        log.info("listening on http://%s:%d (%s)", options.host, options.port, auth)
        config = uvicorn.Config(
            app,
            host=options.host,
            port=options.port,
            log_level=options.log_level,
            timeout_keep_alive=KEEP_ALIVE_SECONDS,
        )
        start_up_finished()  # what waited for the server to be up (huge-page collapse)
        start_up_collector.release(freeze=True)  # what start-up made: never walked again
        with _sigterm_ends_run():
            uvicorn.Server(config).run(sockets=[listener])
        save_prefixes(engine)
    finally:
        listener.close()
        engine.shutdown()  # the worker ranks too
    return 0
