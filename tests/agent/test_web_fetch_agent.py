"""web_fetch through the whole agent loop (`resident run` against the scripted model):
without a grant a headless run stops with exit code 3; an allow rule for the host lets
the fetch run and the model reads the page. And "allow for this session" covers a host.
"""

from __future__ import annotations

from agent.core.commands import SessionApprovals
from agent.core.tool_runner import ApprovalRequest
from tests.agent.helpers import attached, run_cli
from tests.agent.scripted_server import Reply, ScriptedServer, call
from tests.tools.web_server import PageServer
from tools import ApprovalMode, PermissionPolicy, default_registry


def fetch_script(url: str) -> list[Reply]:
    return [
        Reply("Let me read the page.", [call("web_fetch", url=url)]),
        Reply("The page says: just plain text."),
    ]


def test_a_fetch_without_a_grant_needs_approval_and_exits_3(repo):
    with PageServer() as site, ScriptedServer(fetch_script(site.url("/plain.txt"))) as model:
        result = run_cli("summarize the page", *attached(model.url))
        assert site.requests == []  # nothing was fetched
    assert result.exit_code == 3
    requested = result.of_type("approval_requested")[0]
    assert requested["name"] == "web_fetch"
    assert requested["request"] == "Fetch from 127.0.0.1"
    assert "web_fetch:127.0.0.1" in requested["reason"]
    assert result.of_type("approval_resolved")[0]["by"] == "unavailable"
    assert result.final["exit_code"] == 3


def test_network_alone_does_not_open_loopback(repo):
    with PageServer() as site, ScriptedServer(fetch_script(site.url("/plain.txt"))) as model:
        result = run_cli("summarize the page", *attached(model.url, "--network"))
        assert site.requests == []
    assert result.exit_code == 3
    assert "private network" in result.of_type("approval_requested")[0]["reason"]


def test_an_allow_rule_for_the_host_lets_the_fetch_run(repo):
    with PageServer() as site, ScriptedServer(fetch_script(site.url("/plain.txt"))) as model:
        result = run_cli(
            "summarize the page", *attached(model.url, "--allow", "web_fetch:127.0.0.1")
        )
        assert [path for _, path in site.requests] == ["/plain.txt"]
    assert result.exit_code == 0, result.stderr
    assert "approval_requested" not in result.types()
    fetched = result.of_type("tool_result")[0]
    assert fetched["ok"] and "Just plain text." in fetched["output"]
    assert fetched["data"]["status"] == 200
    tool_message = model.requests[1]["messages"][-1]
    assert tool_message["role"] == "tool" and "Just plain text." in tool_message["content"]
    assert result.final["final_message"] == "The page says: just plain text."


def test_allow_for_this_session_covers_the_host_not_others(tmp_path):
    registry = default_registry()
    policy = PermissionPolicy(ApprovalMode.ASK, workspace=tmp_path, sandboxed=True)

    def request(url: str) -> ApprovalRequest:
        decision = policy.check(registry.parse("web_fetch", {"url": url}))
        assert decision.needs_approval
        return ApprovalRequest("id", "web_fetch", decision.request, decision.reason)

    approvals = SessionApprovals()
    approvals.remember(request("https://docs.example.com/a"))
    assert approvals.allows(request("https://docs.example.com/b?page=2"))
    assert approvals.allows(request("http://docs.example.com:8080/"))
    assert not approvals.allows(request("https://example.com/a"))
    assert not approvals.allows(request("https://evil.example.net/?q=docs.example.com"))


def test_plan_mode_asks_before_a_fetch_that_rules_and_network_allow(repo):
    """Plan mode asks before every fetch (issue 38): data can leave in a URL."""
    with PageServer() as site:
        url = site.url("/plain.txt?notes=what-the-agent-read")
        rules = ("--network", "--allow", "web_fetch:127.0.0.1", "--approval", "plan")
        with ScriptedServer(fetch_script(url)) as model:
            result = run_cli("summarize the page", *attached(model.url, *rules))
        assert site.requests == []
    assert result.exit_code == 3
    requested = result.of_type("approval_requested")[0]
    assert requested["name"] == "web_fetch" and "plan mode asks" in requested["reason"]


def test_a_plans_research_child_asks_before_a_fetch_too(repo):
    with PageServer() as site:
        url = site.url("/plain.txt")
        script = [
            Reply("", [call("task", description="read", prompt="Read the page.")]),
            Reply("", [call("web_fetch", url=url)]),
            Reply("I could not read it."),
            Reply("No plan without the page."),
        ]
        rules = ("--network", "--allow", "web_fetch:127.0.0.1", "--approval", "plan")
        with ScriptedServer(script) as model:
            result = run_cli("plan from the page", *attached(model.url, *rules))
        assert site.requests == []
    assert result.of_type("subagent_started")[0]["approval"] == "read-only"
    inner = [e["event"] for e in result.of_type("subagent")]
    asked = [e for e in inner if e["type"] == "approval_requested"]
    assert asked and "plan mode asks" in asked[0]["reason"]
