"""`resident bench routing`: Resident replicas behind the routers people run (issue 40).

Starts N `resident serve` replicas of one model, each in its own process on a
free loopback port with a limited KV budget and no disk tier (a replica starts
cold and cannot hold every repository), then, for each router and policy, a
fresh router in front of them (its binary from the user's install:
sglang-router or vllm-router), replays the same agent-shaped traffic
(routing_traffic.py) through it, streamed, and reads from each answer's usage
what the replica had cached. Between policies every replica's prefix cache is
flushed (POST /flush_cache, the routers' own worker endpoint), so each policy
starts from cold caches and a fresh router.

Figures per policy: the hit rate (cached prompt tokens / prompt tokens, from
`usage.prompt_tokens_details.cached_tokens`), the prefill tokens computed (the
rest), time to first token (the first streamed chunk) mean, p50 and p90, the
requests each replica answered (its /metrics), and the hit rate as a multiple
of the same router's round_robin.

Policies (each router's defaults): round_robin, cache_aware (both routers), the
session key (sglang-router's manual policy on X-SMG-Routing-Key, vllm-router's
consistent_hash on X-Session-Id) and vllm-router's kv_aware, for which the
replicas publish KV events (`--kv-events`) and the router subscribes to each.

Every child (replicas, routers) runs in its own session and is stopped by its
PID (its process group) on the way out, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from engine.devtools.benchmarks.family_runs import wait_healthy
from engine.devtools.benchmarks.measured_process import Running
from engine.devtools.benchmarks.routing_routers import (
    ROUTERS,
    RoutingUsageError,
    check_policies,
    find_router,
    router_command,
    router_version,
    wait_router,
)
from engine.devtools.benchmarks.routing_traffic import (
    Traffic,
    TrafficShape,
    cached_tokens,
    make_traffic,
    over_baseline,
    summarize,
)

GIB = 1024**3
ROOM = 1.0  # default KV room: this multiple of one replica's share of the working set
PROMPT_FORMS = ("chat", "token-ids")
_REQUEST_TIMEOUT_S = 1800.0
_ROUTE = {"chat": "/v1/chat/completions", "token-ids": "/v1/completions"}


def _free_port() -> int:
    from engine.distributed.launch import free_port

    return free_port()


def _stopped(stack: contextlib.ExitStack, command: list[str], env: dict | None = None) -> Running:
    """A child in its own session, stopped by its PID when `stack` unwinds."""
    process = Running(command, env)
    stack.callback(process.stop)
    return process


_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_SERVED = re.compile(r'^resident_http_requests_total\{route="([^"]*)",status="200"\} (\S+)$', re.M)


def _served(url: str, route: str) -> int:
    text = httpx.get(url + "/metrics", timeout=30).text
    return int(sum(float(n) for r, n in _SERVED.findall(text) if r == route))


def _flush(urls: list[str]) -> None:
    """Every replica's prefix cache emptied (and checked so) before a policy runs."""
    for url in urls:
        reply = httpx.post(url + "/flush_cache", timeout=120)
        if reply.status_code != 200:
            raise RuntimeError(f"{url}/flush_cache: {reply.status_code} {reply.text[:500]}")
        deadline = time.monotonic() + 30
        while httpx.get(url + "/v1/engine/stats", timeout=30).json()["cached_tokens"]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} still caches tokens after /flush_cache")
            time.sleep(0.1)


def _answers_tokenize(url: str, model_id: str) -> bool:
    """Whether the replica gives a chat's token ids (what vllm-router's kv_aware asks for:
    /v1/chat/completions/render, else /tokenize)."""
    messages = [{"role": "user", "content": "hi"}]
    for path in ("/v1/chat/completions/render", "/tokenize"):
        with contextlib.suppress(httpx.HTTPError):
            body = {"model": model_id, "messages": messages}
            if httpx.post(url + path, json=body, timeout=30).status_code == 200:
                return True
    return False


async def _stream(client: httpx.AsyncClient, path: str, body: dict, headers: dict):
    """(seconds to the first chunk with a choice, the usage chunk) of one streamed request."""
    start, first, usage = time.perf_counter(), None, None
    async with client.stream("POST", path, json=body, headers=headers) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")
            raise RuntimeError(f"{path}: {response.status_code} {text[:1000]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if "error" in chunk:
                raise RuntimeError(f"{path}: {chunk['error']}")
            if first is None and chunk.get("choices"):
                first = time.perf_counter()
            if chunk.get("usage"):
                usage = chunk["usage"]
    if usage is None:
        raise RuntimeError(f"{path}: the stream carried no usage")
    return (first or time.perf_counter()) - start, usage


async def _replay(
    url: str, traffic: Traffic, model_id: str, form: str, max_tokens: int, concurrency: int,
) -> list[dict]:  # fmt: skip
    """Every session's turns in order, `concurrency` sessions at a time (they start in the
    traffic's order and overlap); one record per request."""
    records: list[dict] = []
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=_REQUEST_TIMEOUT_S, limits=limits) as client:

        async def run(index: int) -> None:
            session = traffic.sessions[index]
            async with gate:
                for turn, messages in enumerate(session.requests):
                    body = {"model": model_id, "max_tokens": max_tokens, "temperature": 0}
                    body |= {"stream": True, "stream_options": {"include_usage": True}}
                    if form == "chat":
                        body["messages"] = messages
                    else:
                        body["prompt"] = session.prompt_ids[turn]
                    ttft, usage = await _stream(client, _ROUTE[form], body, session.headers)
                    records.append(
                        {
                            "session": session.key,
                            "repository": session.repository,
                            "turn": turn,
                            "prompt_tokens": usage["prompt_tokens"],
                            "cached_tokens": cached_tokens(usage),
                            "ttft_s": ttft,
                        }
                    )

        tasks = [asyncio.ensure_future(run(i)) for i in range(len(traffic.sessions))]
        try:
            await asyncio.gather(*tasks)
        finally:  # one failed: the others end before their client closes
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return records


@dataclass
class Replicas:
    urls: list[str]
    model_id: str
    kv_sources: dict[str, str]  # worker URL -> its KV-event endpoint (kv_aware only)
    facts: dict


def _start_replicas(stack, model, count, kv_memory_gib, max_model_len, threads, kv_events):
    env = {**os.environ, "RESIDENT_API_KEY": "", "OMP_NUM_THREADS": str(threads)}
    urls, sources, servers = [], {}, []
    for _ in range(count):
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "engine", "serve", "--model", model, "--port", str(port)]
        command += ["--kv-memory", f"{kv_memory_gib:.6f}", "--max-model-len", str(max_model_len)]
        command += ["--no-kv-disk"]  # cold starts, no page files shared between replicas
        if kv_events:
            sources[url] = f"tcp://127.0.0.1:{_free_port()}"
            command += ["--kv-events", sources[url]]
        servers.append(_stopped(stack, command, env))
        urls.append(url)
    model_id = [wait_healthy(server, url) for server, url in zip(servers, urls, strict=True)][0]
    stats = httpx.get(urls[0] + "/v1/engine/stats", timeout=30).json()
    facts = {
        "count": count,
        "kv_memory_gib": round(kv_memory_gib, 6),
        "capacity_tokens": stats["capacity_tokens"],
        "kv_cache_dtype": stats["kv_cache_dtype"],
        "page_size": stats.get("page_size") or 16,
        "max_model_len": max_model_len,
        "threads": threads,
        "kv_events": kv_events,
        "answers_tokenize": _answers_tokenize(urls[0], model_id),
    }
    return Replicas(urls, model_id, sources, facts)


def _warm_up(replicas: Replicas, form: str) -> None:
    """A first request on each replica (one-time costs off the figures), then cold caches."""
    for url in replicas.urls:
        body = {"model": replicas.model_id, "max_tokens": 2, "temperature": 0}
        if form == "chat":
            body["messages"] = [{"role": "user", "content": "Warm up."}]
        else:
            body["prompt"] = [1, 2, 3, 4, 5, 6, 7, 8]
        reply = httpx.post(url + _ROUTE[form], json=body, timeout=_REQUEST_TIMEOUT_S)
        if reply.status_code != 200:
            raise RuntimeError(f"{url}: warm-up {reply.status_code} {reply.text[:500]}")
    _flush(replicas.urls)


def _policy(name, binary, policy, replicas, traffic, form, max_tokens, concurrency):
    """One fresh router with `policy` over freshly flushed replicas: the traffic's figures."""
    _flush(replicas.urls)
    route = _ROUTE[form]
    before = [_served(url, route) for url in replicas.urls]
    port = _free_port()
    command = router_command(
        name, binary, policy, port, _free_port(), replicas.urls, replicas.kv_sources,
        replicas.facts["page_size"], replicas.model_id,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with contextlib.ExitStack() as stack:
        router = _stopped(stack, command)
        wait_router(router, url, len(replicas.urls), ROUTERS[name].named)
        start = time.perf_counter()
        try:
            records = asyncio.run(
                _replay(url, traffic, replicas.model_id, form, max_tokens, concurrency)
            )
        except (RuntimeError, httpx.HTTPError) as error:
            log = _COLOUR.sub("", router.log_tail())
            raise RuntimeError(f"{name} {policy}: {error}\nthe router's log: {log}") from error
        wall = time.perf_counter() - start
    figures = summarize(records)
    after = [_served(url, route) for url in replicas.urls]
    figures["per_replica_requests"] = [a - b for a, b in zip(after, before, strict=True)]
    figures["wall_s"] = wall
    return figures


def _prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The request's prompt as the server tokenizes a chat (its template, then the text)."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def _sizes(folder: Path, traffic: Traffic, replicas: int, max_tokens: int, kv_memory_gib):
    """(max_model_len, KV GiB per replica): the longest request with room to spare, and
    ROOM x one replica's share of the working set unless the user chose the budget."""
    from engine.kv.sizing import kv_bytes_per_token
    from engine.planner.capacity import kv_layout_for
    from engine.planner.capacity import resolve_model as plan_model

    config = plan_model(str(folder)).config
    wanted = int(traffic.longest_prompt_tokens * 1.25) + max_tokens + 64
    max_model_len = min(-(-wanted // 256) * 256, config.max_position_embeddings)
    if kv_memory_gib is None:
        per_token = kv_bytes_per_token(kv_layout_for(config), "fp8_e4m3")
        tokens = max(ROOM * traffic.working_set_tokens / replicas, max_model_len) + 64
        kv_memory_gib = tokens * per_token / GIB
    return max_model_len, kv_memory_gib


def run_routing(
    model: str,
    routers: dict[str, tuple[str, ...]],
    replicas: int = 2,
    shape: TrafficShape | None = None,
    kv_memory_gib: float | None = None,
    max_tokens: int = 8,
    concurrency: int = 4,
    form: str = "chat",
    threads: int | None = None,
    on_policy=None,
) -> dict:
    """`routers` maps a router (sglang, vllm) to its policies, measured in that order;
    `on_policy(result, router, policy)` is called as each policy finishes."""
    from engine.devtools.benchmarks.serving_paths import machine
    from engine.host.threads import usable_cores
    from engine.model_files.store import resolve_model
    from engine.tokenizers.loading import load_tokenizer

    if form not in PROMPT_FORMS:
        raise RoutingUsageError(f"prompt form {form!r}: choose {', '.join(PROMPT_FORMS)}")
    if replicas < 1 or concurrency < 1 or max_tokens < 1:
        raise RoutingUsageError("replicas, concurrency and max tokens must each be at least 1")
    check_policies(routers, form)
    binaries = {name: find_router(name) for name in routers}  # before anything starts
    folder = resolve_model(model)
    tokenizer = load_tokenizer(folder)

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    def tokenize(messages: list[dict]) -> list[int]:
        return _prompt_ids(tokenizer, messages)

    templated = bool(getattr(tokenizer, "chat_template", None))
    traffic = make_traffic(shape or TrafficShape(), count, tokenize if templated else None)
    if form == "token-ids" and not templated:
        raise RoutingUsageError(f"{model} has no chat template: measure it with chat prompts")
    max_model_len, kv_memory_gib = _sizes(folder, traffic, replicas, max_tokens, kv_memory_gib)
    threads = threads or max(1, usable_cores() // replicas)
    kv_events = "kv_aware" in routers.get("vllm", ())
    result = {
        "benchmark": "routing",
        "model": model,
        "prompt_form": form,
        "max_tokens": max_tokens,
        "concurrency": concurrency,
        "traffic": traffic.describe(),
        "machine": machine(),
        "routers": {
            name: {
                "package": ROUTERS[name].package,
                "version": router_version(name),
                "binary": str(binaries[name]),
                "policies": {},
            }
            for name in routers
        },
        "notes": [],
    }
    with contextlib.ExitStack() as stack:
        served = _start_replicas(
            stack, model, replicas, kv_memory_gib, max_model_len, threads, kv_events
        )
        result["replicas"] = served.facts
        result["traffic"]["best_hit_rate"] = traffic.best_hit_rate(served.facts["page_size"])
        _notes(result, served.facts, traffic, routers, form)
        _warm_up(served, form)
        for name, policies in routers.items():
            measured = result["routers"][name]["policies"]
            for policy in policies:
                measured[policy] = _policy(
                    name, binaries[name], policy, served, traffic, form, max_tokens,
                    concurrency,
                )  # fmt: skip
                over_baseline(measured)
                if on_policy is not None:
                    on_policy(result, name, policy)
    return result


def _notes(result, facts, traffic, routers, form) -> None:
    if facts["capacity_tokens"] >= sum(traffic.repository_tokens):
        result["notes"].append(
            f"each replica's KV ({facts['capacity_tokens']} tokens) holds every repository "
            f"({sum(traffic.repository_tokens)}): policies differ less than they would with "
            "less room; lower --kv-memory for a sharper comparison"
        )
    if "kv_aware" in routers.get("vllm", ()) and form == "chat" and not facts["answers_tokenize"]:
        result["notes"].append(
            "vllm-router's kv_aware scores a chat prompt only with the worker's token ids "
            "(/v1/chat/completions/render or /tokenize), which these replicas do not give: "
            "it placed these requests by load alone (--prompt-form token-ids sends the ids)"
        )


def _ratio(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def header_lines(result: dict) -> list[str]:
    traffic, facts = result["traffic"], result["replicas"]
    low, high = min(traffic["repository_tokens"]), max(traffic["repository_tokens"])
    best = traffic.get("best_hit_rate")
    return [
        f"resident bench routing: {facts['count']} replicas of {result['model']}, KV "
        f"{facts['kv_memory_gib'] * 1024:.1f} MiB each ({facts['capacity_tokens']} tokens, "
        f"{facts['kv_cache_dtype']}; working set {traffic['working_set_tokens']} tokens)",
        f"{traffic['repositories']} repositories of {low}-{high} tokens x "
        f"{traffic['sessions_per_repository']} sessions x {traffic['turns']} turns "
        f"({traffic['requests']} requests), {result['concurrency']} sessions at once, "
        f"{result['prompt_form']} streamed, {result['max_tokens']} tokens out"
        + ("" if best is None else f"; best possible hit rate {best:.3f}"),
        "",
        f"{'router':8}{'policy':17}{'hit rate':>9}{'x RR':>6}{'prefill tok':>12}{'x RR':>6}"
        f"{'TTFT mean':>11}{'p50':>8}{'p90':>8}{'wall':>8}  per replica",
    ]


def policy_line(result: dict, router: str, policy: str) -> str:
    f = result["routers"][router]["policies"][policy]
    return (
        f"{router:8}{policy:17}{f['hit_rate']:>9.3f}{_ratio(f['hit_rate_over_round_robin']):>6}"
        f"{f['prefill_tokens']:>12}{_ratio(f['prefill_tokens_over_round_robin']):>6}"
        f"{f['ttft_mean_s']:>10.3f}s{f['ttft_p50_s']:>7.3f}s{f['ttft_p90_s']:>7.3f}s"
        f"{f['wall_s']:>7.1f}s  " + "/".join(str(n) for n in f["per_replica_requests"])
    )


def format_table(result: dict) -> str:
    lines = header_lines(result)
    for router, measured in result["routers"].items():
        lines += [policy_line(result, router, policy) for policy in measured["policies"]]
    return "\n".join(lines + [f"note: {note}" for note in result["notes"]])
