"""A plain streaming chat with the local engine: what `resident` opens until the TUI lands."""

from __future__ import annotations

import sys

from engine import SamplingParams
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.errors import PromptTooLongError

BANNER = "Resident chat ({model}, KV {kv}). Type /quit or press Ctrl-D to leave, /clear to reset."


def stream_reply(engine: LLMEngine, messages: list[dict], params: SamplingParams) -> str:
    text = engine.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    ids = engine.tokenizer.encode(text, add_special_tokens=False)
    seq = engine.add_request(ids, params)
    reply = []
    try:
        while not seq.is_finished:
            for output in engine.step():
                if output.request_id == seq.request_id:
                    delta = output.outputs[0].delta_text
                    reply.append(delta)
                    sys.stdout.write(delta)
                    sys.stdout.flush()
    except KeyboardInterrupt:
        engine.abort(seq.request_id)
        sys.stdout.write(" [interrupted]")
    sys.stdout.write("\n")
    return "".join(reply)


def run_chat(model: str, kv_cache_dtype: str = "fp8_e4m3") -> None:
    engine = LLMEngine(EngineConfig(model=model, kv_cache_dtype=kv_cache_dtype))
    params = SamplingParams(max_tokens=512, temperature=0.2, top_p=0.9)
    print(BANNER.format(model=model, kv=engine.kv_dtype))
    messages: list[dict] = []
    while True:
        try:
            line = input("> ").strip()
        except (EOFError, KeyboardInterrupt):
            print()
            return
        if not line:
            continue
        if line in ("/quit", "/exit"):
            return
        if line == "/clear":
            messages = []
            continue
        messages.append({"role": "user", "content": line})
        while True:
            try:
                reply = stream_reply(engine, messages, params)
                break
            except PromptTooLongError:
                if len(messages) <= 1:
                    print("That message alone is longer than the model's context.")
                    messages = []
                    reply = None
                    break
                # Forget the oldest exchange and try again, rather than failing the turn.
                messages = messages[2:] if len(messages) > 2 else messages[-1:]
                print("[context full: dropped the oldest exchange]")
        if reply is not None:
            messages.append({"role": "assistant", "content": reply})
