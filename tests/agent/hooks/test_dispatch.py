"""The Hooks object itself: none without a file, what a subagent keeps, how repository hooks run."""

from __future__ import annotations

from pathlib import Path

from agent.core.events import HookRun, parse_event
from agent.core.hooks import open_hooks
from agent.core.hooks.config import Hook
from agent.core.hooks.dispatch import Hooks
from tests.agent.hooks.helpers import user_hooks
from tools import ApprovalMode, ToolContext
from tools.sandbox.bubblewrap import Sandbox
from tools.sandbox.grants import SandboxSettings


def hook(event: str, source: str = "user") -> Hook:
    return Hook(event, "true", source, Path("/cfg/hooks.json"), 0, name=event)  # type: ignore[arg-type]


def make(hooks, mode=ApprovalMode.ASK, sandbox=None) -> Hooks:
    return Hooks(
        hooks,
        workspace=Path("/w"),
        session_id="s",
        emit=lambda event: None,
        approval=lambda: mode,
        sandbox=sandbox,
        settings=SandboxSettings(network=True),
    )


def test_no_hooks_file_means_no_hooks_object(repo):
    context = ToolContext(workspace=repo)
    assert open_hooks(repo, context, lambda: ApprovalMode.ASK, "s", print) is None
    user_hooks({"stop": [{"command": "true"}]})
    hooks = open_hooks(repo, context, lambda: ApprovalMode.ASK, "s", print)
    assert hooks is not None and [h.event for h in hooks.hooks] == ["stop"]


def test_a_subagent_keeps_only_the_tool_hooks():
    parent = make(
        [hook(e) for e in ("session_start", "user_prompt", "pre_tool", "post_tool", "stop")]
    )
    child = parent.for_child(lambda event: None, lambda: ApprovalMode.READ_ONLY)
    assert child is not None and [h.event for h in child.hooks] == ["pre_tool", "post_tool"]
    assert child.approval() is ApprovalMode.READ_ONLY
    assert make([hook("stop")]).for_child(lambda event: None, lambda: ApprovalMode.ASK) is None


def test_repository_hooks_get_the_modes_grant_and_never_more():
    sandbox = Sandbox("/usr/bin/bwrap", "system", "0.11.0", True)
    repo_hook, user_hook = hook("pre_tool", "repository"), hook("pre_tool")
    for mode, writable in [
        (ApprovalMode.READ_ONLY, False),
        (ApprovalMode.ASK, False),
        (ApprovalMode.AUTO_EDIT, False),  # commands still ask there: a hook cannot
        (ApprovalMode.FULL_AUTO, True),
    ]:
        hooks = make([repo_hook, user_hook], mode, sandbox)
        confined = hooks._confinement(repo_hook, mode)
        assert confined.sandbox is sandbox and confined.grant.write is writable
        assert not confined.grant.network and not confined.grant.secrets
        assert confined.settings.network  # --network still applies, as for commands
        assert hooks._confinement(user_hook, mode).sandbox is None


def test_the_hook_event_is_part_of_the_stream_and_round_trips():
    event = HookRun(
        name="guard", hook_event="pre_tool", command="./g.sh", source="repository",
        outcome="timeout", duration_s=1.5, message="timed out", tool="shell", call_id="c1",
    )  # fmt: skip
    assert parse_event(event.model_dump_json()) == event
