"""Hostile fetches (issue 38, item 5): a model that steers web_fetch at this machine or
the cloud metadata service through whatever it was given (a glob rule, --network, a
person's yes), names whose DNS points home or changes between hops, IPv6 spellings of
IPv4 addresses, plan mode with the network on, and names that resolve to an address a
deny rule names.

Each attack runs as the model makes it (`ToolRunner.run` with a real `PermissionPolicy`)
in every approval mode, with nobody to ask and with a person who approves everything,
and is judged by what was dialled (tests/tools/web_network.py), not by what the policy
said.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from agent.core.clients import ToolCall
from agent.core.events import EventEmitter
from agent.core.tool_runner import ApprovalAnswer, ToolRunner
from tests.tools.web_network import PUBLIC_DOWN, PUBLIC_UP, FakeInternet
from tests.tools.web_server import PageServer
from tools import ApprovalMode, PermissionPolicy, Registry, ToolContext, ToolResult
from tools.web.fetch import FetchLimits
from tools.web.tool import WebFetchTool

LIMITS = FetchLimits(connect_timeout_s=2.0, read_timeout_s=2.0, total_timeout_s=10.0)
CONFIGS = [(mode, approver) for mode in ApprovalMode for approver in ("nobody", "yes")]
IDS = [f"{mode.value}+{approver}" for mode, approver in CONFIGS]


@pytest.fixture
def site():
    with PageServer() as server:
        yield server


@pytest.fixture
def internet(monkeypatch):
    return FakeInternet(monkeypatch)


def fetch(workspace, config, url, *, allow=(), deny=(), network=False) -> tuple[ToolResult, bool]:
    """One web_fetch call through the agent's ToolRunner: (result, whether it asked)."""
    mode, approver = config
    ctx = ToolContext(workspace=workspace)
    policy = PermissionPolicy(
        mode, workspace=workspace, allow=allow, deny=deny, sandboxed=True, network=network
    )
    events: list = []

    async def yes(request):
        return ApprovalAnswer(approved=True)

    runner = ToolRunner(
        Registry([WebFetchTool(LIMITS)]),
        ctx,
        policy,
        EventEmitter([events.append]),
        yes if approver == "yes" else None,
    )
    chunk = ToolCall(id="call-0", name="web_fetch", arguments_json=json.dumps({"url": url}))
    result = asyncio.run(runner.run(chunk, history_length=0)).result
    return result, any(e.type == "approval_requested" for e in events)


def assert_never_home(internet, result):
    dialled = [a for a in internet.connected if a not in PUBLIC_UP]
    assert dialled == [], f"dialled {dialled}: {result.output}"
    assert not result.ok, result.output


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
@pytest.mark.parametrize("rule", ["web_fetch(**)", "web_fetch(*.*)", "web_fetch(*:{port})"])
@pytest.mark.parametrize("target", ["127.0.0.1", "169.254.169.254"])
def test_a_glob_rule_does_not_open_a_name_that_points_home(
    workspace, site, internet, config, rule, target
):
    host = internet.name("home.example", [target])
    url = f"http://{host}:{site.port}/plain.txt"
    result, _ = fetch(workspace, config, url, allow=[rule.format(port=site.port)])
    assert_never_home(internet, result)
    assert site.requests == []
    if "Not fetched" in result.output:  # ran, and was refused after resolution
        assert f"resolves to {target}" in result.output


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
@pytest.mark.parametrize("rule", ["web_fetch(**)", "web_fetch(*:{port})"])
def test_a_glob_rule_does_not_open_a_local_address_in_the_url(
    workspace, site, internet, config, rule
):
    result, asked = fetch(
        workspace, config, site.url("/plain.txt"), allow=[rule.format(port=site.port)]
    )
    assert asked or not result.ok  # the glob granted nothing: a person decides, or no one
    if not (asked and config[1] == "yes"):
        assert site.requests == []


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "64:ff9b:1::a9fe:a9fe",  # local-use NAT64
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
        "::169.254.169.254",  # IPv4-compatible
        "::ffff:127.0.0.1",  # IPv4-mapped
        "::ffff:0:a9fe:a9fe",  # IPv4-translated
        "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo to 127.0.0.1
    ],
)
def test_ipv6_spellings_of_local_ipv4_are_not_dialled(workspace, site, internet, config, address):
    host = internet.name("six.example", [address])
    for allow in ((), ("web_fetch(*.example)",)):
        result, _ = fetch(
            workspace, config, f"http://{host}:{site.port}/plain.txt", allow=allow, network=True
        )
        assert internet.connected == [], result.output
        assert not result.ok


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
@pytest.mark.parametrize(
    ("allow", "network"),
    [(("web_fetch(*.example)",), False), (("web_fetch:rebind.example",), False), ((), True)],
)
def test_a_name_that_rebinds_between_hops_is_judged_again(
    workspace, site, internet, config, allow, network
):
    """The first lookup gives a public address, the next one loopback: the redirect's
    new connection resolves again, and that answer is judged like the first."""
    host = internet.name("rebind.example", [PUBLIC_UP[0]], ["127.0.0.1"])
    result, asked = fetch(
        workspace, config, f"http://{host}:{site.port}/chain/1", allow=allow, network=network
    )
    assert "127.0.0.1" not in internet.connected, result.output
    assert not result.ok
    if internet.connected:  # it ran: the first hop went out, the second was refused
        assert internet.connected == [PUBLIC_UP[0]]
        assert [path for _, path in site.requests] == ["/chain/1"]
        assert "rebind.example resolves to 127.0.0.1" in result.output


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_plan_mode_asks_before_any_fetch_with_the_network_on(workspace, site, internet, config):
    host = internet.name("docs.example", [PUBLIC_UP[0]])
    url = f"http://{host}:{site.port}/plain.txt?notes=what-the-agent-read"
    allow = ("web_fetch:docs.example", "web_fetch")
    result, asked = fetch(workspace, config, url, allow=allow, network=True)
    mode, approver = config
    if mode is ApprovalMode.PLAN:
        assert asked
        assert result.ok is (approver == "yes"), result.output
        assert bool(site.requests) is (approver == "yes")
    else:  # the rules and --network allow it without asking
        assert not asked and result.ok, result.output
    assert internet.connected in ([], [PUBLIC_UP[0]])


def test_an_address_a_rule_names_is_reached_through_a_name(workspace, site, internet):
    """The intranet case: a rule naming the address opens it, whatever name leads there."""
    host = internet.name("wiki.corp", ["127.0.0.1"])
    url = f"http://{host}:{site.port}/plain.txt"
    allow = ("web_fetch:wiki.corp", f"web_fetch:127.0.0.1:{site.port}")
    result, asked = fetch(workspace, (ApprovalMode.ASK, "nobody"), url, allow=allow)
    assert result.ok and not asked, result.output
    other_port = ("web_fetch:wiki.corp", "web_fetch:127.0.0.1:1")
    result, _ = fetch(workspace, (ApprovalMode.ASK, "nobody"), url, allow=other_port)
    assert not result.ok and "resolves to 127.0.0.1" in result.output
    assert len(site.requests) == 1


# -- deny rules that name an address: applied to what every name resolves to ----------------

DENIED = PUBLIC_UP[0]  # public and served: fetched, were the deny rule read on the URL alone
NAT64_OF_DENIED = "64:ff9b::5db8:d70e"  # 93.184.215.14 through a NAT64 gateway
DENY_RULES = [
    "web_fetch:{address}",
    "web_fetch:{address}:{port}",
    "*:{address}",
    "web_fetch(93.184.*)",
]


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
@pytest.mark.parametrize("rule", DENY_RULES)
@pytest.mark.parametrize(
    "answer",
    [[DENIED], [f"::ffff:{DENIED}"], [NAT64_OF_DENIED], [PUBLIC_DOWN[0], DENIED]],
    ids=["address", "ipv4-mapped", "nat64", "one-of-two"],
)
def test_a_deny_rule_naming_an_address_refuses_a_name_that_resolves_to_it(
    workspace, site, internet, config, rule, answer
):
    """`--deny web_fetch:8.8.8.8` holds for every name whose DNS leads there, with the
    name allowed, --network on and a person who approves everything."""
    host = internet.name("docs.example", answer)
    url = f"http://{host}:{site.port}/plain.txt"
    deny = [rule.format(address=DENIED, port=site.port)]
    allow = ("web_fetch:docs.example", "web_fetch")
    result, _ = fetch(workspace, config, url, allow=allow, deny=deny, network=True)
    assert internet.connected == [], result.output  # no address of the name was dialled
    assert site.requests == [] and not result.ok
    if "Not fetched" in result.output:  # ran, and was refused after resolution
        assert "deny rule" in result.output and f"{host} resolves to" in result.output


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
@pytest.mark.parametrize("target", ["127.0.0.1", "10.0.0.5"])
def test_a_deny_rule_wins_over_an_allow_rule_naming_the_address(
    workspace, site, internet, config, target
):
    host = internet.name("wiki.corp", [target])
    url = f"http://{host}:{site.port}/plain.txt"
    allow = ("web_fetch:wiki.corp", f"web_fetch:{target}")
    result, _ = fetch(workspace, config, url, allow=allow, deny=[f"web_fetch:{target}"])
    assert internet.connected == [], result.output
    assert site.requests == [] and not result.ok


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_a_denied_address_is_refused_on_a_redirect_hop(workspace, site, internet, config):
    """The first lookup gives an address no rule names, the redirect's new connection
    one a deny rule names: that hop is refused before it is dialled."""
    host = internet.name("hop.example", [PUBLIC_UP[0]], [PUBLIC_DOWN[0]])
    deny = [f"web_fetch:{PUBLIC_DOWN[0]}"]
    result, _ = fetch(
        workspace, config, f"http://{host}:{site.port}/chain/1", deny=deny, network=True
    )
    assert PUBLIC_DOWN[0] not in internet.connected, result.output
    assert not result.ok
    if internet.connected:  # it ran: the first hop went out, the second was refused
        assert internet.connected == [PUBLIC_UP[0]]
        assert f"hop.example resolves to {PUBLIC_DOWN[0]}" in result.output
        assert "deny rule" in result.output


def test_a_deny_rule_for_another_port_leaves_the_address_alone(workspace, site, internet):
    host = internet.name("docs.example", [DENIED])
    url = f"http://{host}:{site.port}/plain.txt"
    result, _ = fetch(
        workspace, (ApprovalMode.ASK, "nobody"), url, deny=[f"web_fetch:{DENIED}:1"], network=True
    )
    assert result.ok, result.output
    assert internet.connected == [DENIED]
