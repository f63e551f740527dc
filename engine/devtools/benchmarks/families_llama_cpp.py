"""llama.cpp's side of `resident bench families`: its own tools on the GGUF file, each run
in a process of its own, on the same thread count as Resident.

- one_stream: `llama-bench -d 512 -p 0 -n 128`: the KV cache is filled with a
  512-token context untimed, then 128 single-token decode steps are timed.
- long_context: `llama-bench -d 8192 -p 0 -n 64 -ctk q8_0 -ctv q8_0`, its 8-bit
  KV cache against Resident's FP8.
- prefill: `llama-bench -p 2048 -n 0`.
- batch16: `llama-batched-bench -npp 512 -ntg 128 -npl 16` where it is built
  (`cmake --build build --target llama-batched-bench`): its 16 sequences' 128
  decode steps after their prompts, timed directly (`speed_tg`), as Resident's
  side times its own. Without it, `llama-server -np 16`, kept up across rounds,
  asked for 16 completions at once (prompt token ids, EOS ignored, its prompt
  cache off) with one token and with `new + 1` tokens each; the difference of
  the best times is the decode of 16 x new tokens, and the result says so
  (`batch16_method`): half a minute of prefill on each side of the difference
  makes that figure noisier.
- load: a fresh `llama-server` (its defaults) timed to its first token.
Each llama-bench run is one repetition (`-r 1`) after its own warm-up; the
rounds, not llama-bench, repeat.

llama.cpp's extra buffer types (`--repack`, its AMX kernels on a CPU with AMX)
are on by default. Where they crash (their AMX Q4_1 kernel dies with SIGILL
on some VMs that do expose AMX) the runs go without them, and the result says so.
"""

from __future__ import annotations

import json
import subprocess

from engine.devtools.benchmarks.family_files import LlamaCpp
from engine.devtools.benchmarks.family_runs import (
    SIZES,
    concurrent_completions,
    prompt_ids,
    time_to_first_token,
    wait_healthy,
)
from engine.devtools.benchmarks.measured_process import Running

_BENCH_TIMEOUT_S = 3600.0
_PROBE = ("-p", "64", "-n", "0", "--no-warmup")
_SLOT_PAD = 16  # tokens per llama-server slot beyond prompt + output


class LlamaCppSide:
    name = "llama_cpp"

    def __init__(self, llama_cpp: LlamaCpp, gguf, threads: int):
        self.llama_cpp, self.gguf, self.threads = llama_cpp, str(gguf), threads
        self.bench_flags: list[str] = []
        self.server_flags: list[str] = []
        self.facts: dict = {"version": llama_cpp.version(), "repack": True}
        self._server: tuple[Running, str, str] | None = None
        self._probe_repack()

    def _bench(self, *args: str) -> dict:
        command = [str(self.llama_cpp.binary("llama-bench")), "-m", self.gguf]
        command += ["-t", str(self.threads), "-r", "1", "-o", "json", *self.bench_flags, *args]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=_BENCH_TIMEOUT_S)
        except subprocess.TimeoutExpired as err:
            raise RuntimeError(
                f"llama-bench {' '.join(args)} ran past {_BENCH_TIMEOUT_S} s"
            ) from err
        if done.returncode != 0:
            raise RuntimeError(
                f"llama-bench {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}"
            )
        try:
            (test,) = json.loads(done.stdout)
            return {"tok_s": float(test["avg_ts"])}
        except (ValueError, KeyError, TypeError) as err:
            raise RuntimeError(f"llama-bench {' '.join(args)} said: {done.stdout[-2000:]}") from err

    def _probe_repack(self) -> None:
        """A short prefill with llama.cpp's defaults; without repacking if that dies."""
        try:
            self._bench(*_PROBE)
            return
        except RuntimeError as err:
            crash = str(err)
        self.bench_flags, self.server_flags = ["--repack", "0"], ["--no-repack"]
        self._bench(*_PROBE)  # a second failure is not the extra buffers': let it rise
        self.facts.update(repack=False, repack_crash=crash[:500])

    def _server_command(self, port: int, *options: str) -> list[str]:
        command = [str(self.llama_cpp.binary("llama-server")), "-m", self.gguf]
        command += ["-t", str(self.threads), "--host", "127.0.0.1", "--port", str(port)]
        return [*command, *self.server_flags, *options]

    def _batched_bench(self) -> dict:
        """llama-batched-bench's decode rate of the batch16 figure's sequences."""
        size = SIZES["batch16"]
        context = size["sequences"] * (size["prompt"] + size["new"] + _SLOT_PAD)
        command = [str(self.llama_cpp.binary("llama-batched-bench")), "-m", self.gguf]
        command += ["-t", str(self.threads), "-c", str(context), "--output-format", "jsonl"]
        command += ["-npp", str(size["prompt"]), "-ntg", str(size["new"])]
        command += ["-npl", str(size["sequences"]), *self.server_flags]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=_BENCH_TIMEOUT_S)
        except subprocess.TimeoutExpired as err:
            raise RuntimeError(f"llama-batched-bench ran past {_BENCH_TIMEOUT_S} s") from err
        if done.returncode != 0:
            raise RuntimeError(
                f"llama-batched-bench exited {done.returncode}: {done.stderr[-2000:]}"
            )
        for line in done.stdout.splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and row.get("pl") == size["sequences"]:
                return {"tok_s": float(row["speed_tg"])}
        raise RuntimeError(f"llama-batched-bench said: {done.stdout[-2000:]}")

    def _batch(self, seed: int) -> dict:
        if not self.llama_cpp.lacking(("llama-batched-bench",)):
            self.facts["batch16_method"] = "llama-batched-bench speed_tg"
            return self._batched_bench()
        self.facts["batch16_method"] = "llama-server, difference of the best whole times"
        from engine.distributed.launch import free_port

        size = SIZES["batch16"]
        if self._server is None:
            port = free_port()
            slots = size["sequences"]
            context = slots * (size["prompt"] + size["new"] + _SLOT_PAD)
            server = Running(self._server_command(port, "-np", str(slots), "-c", str(context)))
            url = f"http://127.0.0.1:{port}"
            try:
                model = wait_healthy(server, url)
            except RuntimeError:
                server.stop()
                raise
            self._server = (server, url, model)
            concurrent_completions(url, model, [prompt_ids(64, -1)], 8, {})  # warm-up
        _, url, model = self._server
        prompts = [prompt_ids(size["prompt"], seed * 1000 + i) for i in range(size["sequences"])]
        extra = {"cache_prompt": False}  # llama-server would reuse a slot's matching prefix

        def timed(tokens: int) -> float:
            return concurrent_completions(url, model, prompts, tokens, extra)

        return {"first_s": timed(1), "whole_s": timed(size["new"] + 1)}

    def measure(self, figure: str, seed: int) -> dict:
        size = SIZES[figure]
        if figure == "one_stream":
            return self._bench("-d", str(size["prompt"]), "-p", "0", "-n", str(size["new"]))
        if figure == "long_context":
            kv = ("-ctk", "q8_0", "-ctv", "q8_0")
            return self._bench("-d", str(size["prompt"]), "-p", "0", "-n", str(size["new"]), *kv)
        if figure == "prefill":
            return self._bench("-p", str(size["prompt"]), "-n", "0")
        if figure == "batch16":
            return self._batch(seed)
        if figure == "load":
            from engine.distributed.launch import free_port

            port = free_port()
            return time_to_first_token(self._server_command(port), f"http://127.0.0.1:{port}")
        raise ValueError(f"unknown figure {figure!r}")

    def close(self) -> dict:
        if self._server is not None:
            self.facts["batch_server_peak_rss_bytes"] = self._server[0].stop()
            self._server = None
        return self.facts
