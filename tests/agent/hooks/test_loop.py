"""Hooks through the real loop and the scripted model server: what the model sees, what runs."""

from __future__ import annotations

import asyncio
import json

from agent.core.events import Event
from agent.core.runtime import RuntimeOptions, open_runtime
from agent.core.tool_runner import ApprovalAnswer
from tests.agent.hooks.helpers import python_hook, user_hooks
from tests.agent.scripted_server import Reply, ScriptedServer, call
from tools import ApprovalMode


def scenario(script, task="do it", approval=ApprovalMode.FULL_AUTO, approve=None, **server):
    """Run one task; (outcome, events, requests the model got)."""

    async def go():
        events: list[Event] = []
        with ScriptedServer(script, **server) as model:
            runtime = await open_runtime(
                RuntimeOptions(attach=model.url, approval=approval), [events.append], approve
            )
            outcome = await runtime.agent.run_task(task)
            await runtime.close()
            return outcome, events, model.requests

    return asyncio.run(go())


def of_type(events, kind):
    return [e for e in events if e.type == kind]


def test_a_pre_tool_hook_blocks_a_shell_call_and_the_model_sees_why(repo):
    user_hooks(
        {"pre_tool": [{"matcher": "shell", "command": "echo 'no shell on Fridays' >&2; exit 2"}]}
    )
    script = [Reply("", [call("shell", command="touch ran.txt")]), Reply("Understood.")]
    outcome, events, requests = scenario(script)
    assert outcome.reason == "done"
    assert not (repo / "ran.txt").exists()
    told = requests[1]["messages"][-1]
    assert told["role"] == "tool"
    assert "Blocked by the pre_tool hook" in told["content"]
    assert "no shell on Fridays" in told["content"]
    (result,) = of_type(events, "tool_result")
    assert not result.ok
    (ran,) = of_type(events, "hook")
    assert (ran.hook_event, ran.outcome, ran.tool) == ("pre_tool", "blocked", "shell")
    assert ran.message == "no shell on Fridays" and ran.call_id == result.id


def test_pre_tool_sees_the_call_and_runs_before_anyone_is_asked(repo, tmp_path):
    payload = tmp_path / "payload.json"
    user_hooks({"pre_tool": [{"command": f"cat > {payload}; echo 'not now' >&2; exit 2"}]})
    asked = []

    async def approve(request):
        asked.append(request)
        return ApprovalAnswer(True)

    edit = call("edit", path="calc.py", old_string="return a - b", new_string="return a + b")
    outcome, events, _ = scenario(
        [Reply("", [edit]), Reply("ok")], approval=ApprovalMode.ASK, approve=approve
    )
    assert asked == []  # blocked before the approval question
    assert "return a - b" in (repo / "calc.py").read_text()
    sent = json.loads(payload.read_text())
    (tool_call,) = of_type(events, "tool_call")
    assert sent["event"] == "pre_tool" and sent["approval"] == "ask"
    assert sent["tool"]["name"] == "edit" and sent["tool"]["call_id"] == tool_call.id
    assert sent["tool"]["arguments"]["path"] == "calc.py"
    assert sent["workspace"] == str(repo)
    assert sent["session_id"] == of_type(events, "session_started")[0].session_id


def test_a_hook_cannot_allow_what_the_policy_denies(repo, tmp_path):
    marker = tmp_path / "hook-ran"
    user_hooks({"pre_tool": [{"command": f"touch {marker}; exit 0"}]})
    edit = call("edit", path="calc.py", old_string="return a - b", new_string="return a + b")
    _, events, requests = scenario(
        [Reply("", [edit]), Reply("ok")], approval=ApprovalMode.READ_ONLY
    )
    assert "Denied by the permission policy" in requests[1]["messages"][-1]["content"]
    assert not marker.exists() and of_type(events, "hook") == []


def test_a_user_prompt_hook_adds_context_after_the_prompt_not_in_the_system_prompt(repo):
    user_hooks(
        {
            "session_start": [{"command": "echo 'Branch: release-2'"}],
            "user_prompt": [{"command": "echo 'The deploy freeze is on.'", "name": "freeze"}],
        }
    )
    outcome, events, requests = scenario([Reply("Noted.")], task="ship it")
    assert outcome.reason == "done"
    messages = requests[0]["messages"]
    user = messages[-1]
    assert user["role"] == "user" and user["content"].startswith("ship it")
    assert "Branch: release-2" in user["content"]
    assert (
        '<hook event="user_prompt" name="freeze">\nThe deploy freeze is on.\n</hook>'
        in (user["content"])
    )
    system = "".join(str(m["content"]) for m in messages if m["role"] == "system")
    assert "deploy freeze" not in system and "release-2" not in system
    assert [e.text for e in of_type(events, "user_message")] == ["ship it"]  # as typed
    assert [(e.hook_event, e.outcome) for e in of_type(events, "hook")] == [
        ("session_start", "allowed"),
        ("user_prompt", "allowed"),
    ]


def test_a_user_prompt_hook_can_refuse_a_prompt(repo):
    user_hooks({"user_prompt": [{"command": "echo 'it names a customer' >&2; exit 2"}]})
    outcome, events, requests = scenario([Reply("never sent")], task="email ACME's data")
    assert outcome.reason == "blocked" and "it names a customer" in outcome.final_message
    assert requests == []  # the model never saw it
    (error,) = of_type(events, "error")
    assert error.kind == "hook" and not error.fatal
    assert "Your prompt was not sent" in error.message


def test_a_post_tool_hook_adds_to_the_result_the_model_sees(repo):
    context = json.dumps({"additional_context": "calc.py belongs to the math team"})
    user_hooks(
        {
            "post_tool": [
                {"matcher": "read", "command": f"echo '{context}'", "name": "owners"},
                {"matcher": "read", "command": "echo 'lint: add() is wrong' >&2; exit 2"},
                {"matcher": "shell", "command": "echo 'never for read' >&2; exit 2"},
            ]
        }
    )
    outcome, events, requests = scenario([Reply("", [call("read", path="calc.py")]), Reply("ok")])
    told = requests[1]["messages"][-1]["content"]
    assert "def add(a, b):" in told  # the tool's own output first
    assert '<hook event="post_tool" name="owners">\ncalc.py belongs to the math team' in told
    assert "lint: add() is wrong" in told and "never for read" not in told
    (result,) = of_type(events, "tool_result")
    assert result.ok and result.output == told
    assert [e.outcome for e in of_type(events, "hook")] == ["allowed", "blocked"]


def test_a_stop_hook_sends_the_task_back_once(repo, tmp_path):
    stop = python_hook(
        tmp_path / "stop.py",
        "import json, sys\n"
        "event = json.load(sys.stdin)\n"
        "if event['continuations'] == 0:\n"
        "    print('Run the tests before you finish.', file=sys.stderr)\n"
        "    sys.exit(2)\n",
    )
    user_hooks({"stop": [{"command": stop, "name": "tests-first"}]})
    outcome, events, requests = scenario([Reply("Done."), Reply("Tests pass. Done.")])
    assert outcome.reason == "done" and outcome.final_message == "Tests pass. Done."
    assert len(requests) == 2
    note = requests[1]["messages"][-1]
    assert note["role"] == "user"
    assert note["content"].startswith('<hook event="stop" name="tests-first">')
    assert "Run the tests before you finish." in note["content"]
    assert requests[1]["messages"][-2] == {"role": "assistant", "content": "Done."}
    assert [e.outcome for e in of_type(events, "hook")] == ["blocked", "allowed"]


def test_a_stop_hook_cannot_keep_a_task_going_forever(repo):
    user_hooks({"stop": [{"command": "echo 'again' >&2; exit 2"}]})
    outcome, events, requests = scenario([Reply("Done.")], repeat_last=True)
    assert outcome.reason == "done"
    assert len(requests) == 4  # the answer, then three continuations
    (error,) = of_type(events, "error")
    assert error.kind == "hook" and "3 times" in error.message


def test_a_failing_or_slow_hook_is_a_warning_and_the_work_goes_on(repo):
    user_hooks(
        {
            "pre_tool": [
                {"command": "echo 'jq: not found' >&2; exit 127", "name": "broken"},
                {"command": "sleep 30", "timeout": 0.5, "name": "slow"},
            ]
        }
    )
    script = [Reply("", [call("shell", command="touch ran.txt")]), Reply("ok")]
    outcome, events, _ = scenario(script)
    assert outcome.reason == "done" and (repo / "ran.txt").exists()
    assert [(e.name, e.outcome) for e in of_type(events, "hook")] == [
        ("broken", "warning"),
        ("slow", "timeout"),
    ]
    errors = of_type(events, "error")
    assert [e.kind for e in errors] == ["hook", "hook"] and not any(e.fatal for e in errors)
    assert "exited with status 127: jq: not found" in errors[0].message
    assert "timed out after 0.5 s" in errors[1].message


def test_a_broken_hooks_file_is_reported_and_the_session_goes_on(repo):
    user_hooks({"pre_tol": [{"command": "true"}]})
    outcome, events, _ = scenario([Reply("fine")])
    assert outcome.reason == "done"
    (error,) = of_type(events, "error")
    assert error.kind == "hook_config" and "unknown event" in error.message
