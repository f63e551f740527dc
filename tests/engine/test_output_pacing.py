"""Output pacing (engine/requests/pacing.py): streamed tokens held a few ms and merged.

The pacer is checked on a clock the test moves, then through AsyncEngine on a
tiny model: whatever the interval, a stream's deltas add up to exactly its
final text and tokens, the first output is never held and neither is the last.
"""

from __future__ import annotations

import asyncio

import pytest

from engine.requests.outputs import CompletionOutput, RequestOutput
from engine.requests.pacing import OutputPacer, merge_outputs


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Stream:
    """Outputs of one request as the engine makes them: cumulative text, new deltas."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.tokens: list[int] = []
        self.text = ""

    def step(self, token: int, finished: bool = False) -> RequestOutput:
        self.tokens.append(token)
        self.text += f"<{token}>"
        completion = CompletionOutput(
            index=0,
            text=self.text,
            token_ids=list(self.tokens),
            logprobs=None,
            finish_reason="length" if finished else None,
            delta_text=f"<{token}>",
            delta_token_ids=[token],
        )
        return RequestOutput(self.request_id, None, [1, 2], [completion], finished)


def test_merging_gives_the_later_output_both_deltas():
    stream = Stream("a")
    first, second = stream.step(5), stream.step(6)
    merged = merge_outputs(first, second)
    assert merged.outputs[0].delta_token_ids == [5, 6]
    assert merged.outputs[0].delta_text == "<5><6>"
    assert merged.outputs[0].token_ids == [5, 6]
    assert merged.outputs[0].text == "<5><6>"


def test_first_output_goes_at_once_then_tokens_wait_for_the_interval():
    clock = Clock()
    pacer = OutputPacer(0.05, clock)
    pacer.last_step = 0.004
    stream = Stream("a")
    assert [o.outputs[0].delta_token_ids for o in pacer.admit([stream.step(1)])] == [[1]]
    delivered = []
    for token in range(2, 40):
        clock.now += 0.004
        delivered.append(pacer.admit([stream.step(token)]))
    batches = [batch for batch in delivered if batch]
    # Held until one more 4 ms step would pass 50 ms: the oldest token goes after
    # 48 ms, with the 12 made since (48 ms + 4 ms >= 50 ms).
    assert [b[0].outputs[0].delta_token_ids for b in batches] == [
        list(range(2, 15)),
        list(range(15, 28)),
    ]
    assert pacer.holding
    held = pacer.take()
    assert held[0].outputs[0].delta_token_ids == list(range(28, 40))
    assert not pacer.holding and pacer.take() == []


def test_a_finished_request_takes_everything_held_with_it():
    clock = Clock()
    pacer = OutputPacer(1.0, clock)
    a, b = Stream("a"), Stream("b")
    pacer.admit([a.step(1), b.step(1)])  # first outputs: at once
    assert pacer.admit([a.step(2), b.step(2)]) == []
    out = pacer.admit([a.step(3), b.step(3, finished=True)])
    by_id = {o.request_id: o for o in out}
    assert by_id["a"].outputs[0].delta_token_ids == [2, 3] and not by_id["a"].finished
    assert by_id["b"].outputs[0].delta_token_ids == [2, 3] and by_id["b"].finished
    # A request joining later is not held behind the others' interval.
    c = Stream("c")
    assert pacer.admit([a.step(4)]) == []
    assert {o.request_id for o in pacer.admit([c.step(1)])} == {"a", "c"}


def test_due_before_a_step_that_would_keep_tokens_too_long():
    clock = Clock()
    pacer = OutputPacer(0.05, clock)
    stream = Stream("a")
    pacer.admit([stream.step(1)])
    assert not pacer.due()  # nothing held
    pacer.last_step = 0.03
    assert pacer.admit([stream.step(2)]) == []
    clock.now += 0.019
    assert not pacer.due()  # 19 ms + a 30 ms step < 50 ms
    clock.now += 0.001
    assert pacer.due()


def test_interval_zero_sends_every_step():
    pacer = OutputPacer(0.0, Clock())
    stream = Stream("a")
    for token in range(5):
        assert [o.outputs[0].delta_token_ids for o in pacer.admit([stream.step(token)])] == [
            [token]
        ]


def _stream(engine, prompt: str, max_tokens: int) -> list:
    from engine.requests.params import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)

    async def run() -> list:
        return [output async for output in engine.generate(prompt, params, "paced")]

    return asyncio.run(run())


@pytest.mark.parametrize("interval_ms", [0.0, 1000.0])
def test_async_engine_streams_add_up_to_the_whole(tiny_llama_dir, interval_ms):
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig

    engine = AsyncEngine(
        EngineConfig(model=str(tiny_llama_dir), kv_cache_dtype="bf16", stream_interval_ms=0)
    )
    try:
        assert asyncio.run(engine.stats())["stream_interval_ms"] == 0
        whole = _stream(engine, "hello there", 24)
        engine._pacer.interval = interval_ms / 1000
        engine._pacer.clock = lambda: 0.0  # time stands still: only the rules release
        paced = _stream(engine, "hello there", 24)
    finally:
        engine.shutdown()
    final = paced[-1].outputs[0]
    assert paced[-1].finished and final.token_ids == whole[-1].outputs[0].token_ids
    assert sum((o.outputs[0].delta_token_ids for o in paced), []) == final.token_ids
    assert "".join(o.outputs[0].delta_text for o in paced) == final.text
    assert len(paced[0].outputs[0].delta_token_ids) == 1  # time to first token: not held
    if interval_ms == 0:
        assert len(paced) == 24
    else:  # the first token, then everything else with the last
        assert [len(o.outputs[0].delta_token_ids) for o in paced] == [1, 23]


def test_tokens_held_when_a_step_fails_reach_the_reader_before_the_error(tiny_llama_dir):
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig
    from engine.requests.params import SamplingParams

    engine = AsyncEngine(
        EngineConfig(model=str(tiny_llama_dir), kv_cache_dtype="bf16", stream_interval_ms=1000)
    )
    engine._pacer.clock = lambda: 0.0  # nothing leaves by time: only the rules release
    real_step, steps = engine.engine.step, []

    def failing_step():
        steps.append(1)
        if len(steps) == 6:
            raise RuntimeError("a broken kernel")
        return real_step()

    engine.engine.step = failing_step
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    received: list = []

    async def run() -> None:
        async for output in engine.generate("hello there", params, "failing"):
            received.append(output)

    try:
        with pytest.raises(RuntimeError, match="a broken kernel"):
            asyncio.run(run())
    finally:
        engine.shutdown()
    # The first token alone, then the four held ones, flushed before the error.
    assert [len(o.outputs[0].delta_token_ids) for o in received] == [1, 4]
    assert sum((o.outputs[0].delta_token_ids for o in received), []) == (
        received[-1].outputs[0].token_ids
    )


def test_stats_of_a_failed_engine_do_not_wait_for_a_blocked_step(tiny_llama_dir):
    """After a rank died, the engine thread may sit in a step on it until the transport
    gives up: /v1/engine/stats answers from the failure and the ranks meanwhile."""
    import threading
    import time

    from engine.async_engine import FAILED_STATS_WAIT_S, AsyncEngine
    from engine.config import EngineConfig

    engine = AsyncEngine(EngineConfig(model=str(tiny_llama_dir), kv_cache_dtype="bf16"))
    release = threading.Event()
    engine.engine.stats = lambda: release.wait(30) and {}  # the thread is held
    engine.engine.executor.failure = "rank 1 (pid 1) was killed by SIGKILL"
    try:
        start = time.monotonic()
        stats = asyncio.run(engine.stats())
        waited = time.monotonic() - start
    finally:
        release.set()
        engine.shutdown()
    assert stats["failure"].startswith("rank 1") and stats["parallel"]["ranks_alive"] == 1
    assert FAILED_STATS_WAIT_S <= waited < FAILED_STATS_WAIT_S + 20  # not the held 30 s
