"""On the local engine a child's first request is served from the parent's pinned prefix:
only the child's own task is prefilled. The figures for a 4k-token snapshot, cold against
warm, come from bench/subagent_prefix.py; this checks the mechanism on the default model."""

from __future__ import annotations

import asyncio

import pytest

from agent.core.loop import AgentSettings
from agent.core.runtime import RuntimeOptions, open_runtime
from agent.core.subagents import TaskArgs
from agent.core.subagents.child import run_child
from tests.agent.test_local_client import _default_model_present
from tools import ApprovalMode


@pytest.mark.slow
@pytest.mark.skipif(not _default_model_present(), reason="run `resident models pull` first")
def test_a_childs_first_request_reuses_the_parents_resident_prefix(repo):
    async def scenario():
        events = []
        options = RuntimeOptions(
            workspace=repo,
            approval=ApprovalMode.READ_ONLY,
            settings=AgentSettings(max_turns=1, max_tokens=1),
            checkpoints=False,
        )
        runtime = await open_runtime(options, [events.append])
        try:
            await runtime.agent.run_task("Reply with OK.")
            pinned = len(runtime.client._pinned_ids)
            args = TaskArgs(description="look", prompt="Which file defines add?")
            result = await run_child(runtime.agent, "child-1", args, runtime.agent.tools.ctx)
        finally:
            await runtime.close()
        return events, pinned, result

    events, pinned, result = asyncio.run(scenario())
    parent_usage = next(e for e in events if e.type == "usage")
    done = next(e for e in events if e.type == "subagent_completed")
    assert result.ok, result.output
    assert parent_usage.cached_tokens == 0 or parent_usage.cached_tokens < pinned
    # Every full page of the resident prefix came from the cache: at most one partial
    # page of it (16 tokens) and the child's own task were prefilled.
    assert pinned > 1000
    assert done.first_cached_tokens >= pinned - 16
    assert done.first_prompt_tokens - done.first_cached_tokens < 200
