"""The permission policy's verdicts on web fetches: every mode with and without
--network, allow and deny rules, wildcard domains, local hosts, the grant."""

from __future__ import annotations

import pytest

from tools import ApprovalMode, PermissionPolicy, ToolCall, Verdict
from tools.web.url import host_matches, is_local_host, parse_web_url

ALLOW, ASK, DENY = Verdict.ALLOW, Verdict.ASK, Verdict.DENY
MODES = list(ApprovalMode)
# Plan mode asks before every fetch whatever the rules say (test_web_addresses.py).
RULED_MODES = [m for m in MODES if m is not ApprovalMode.PLAN]


@pytest.fixture
def decide(registry, workspace):
    def run(url, mode=ApprovalMode.ASK, network=False, allow=(), deny=()):
        policy = PermissionPolicy(
            mode, workspace=workspace, allow=allow, deny=deny, sandboxed=True, network=network
        )
        call = registry.parse("web_fetch", {"url": url})
        assert isinstance(call, ToolCall), call
        return policy.check(call)

    return run


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_without_network_a_fetch_asks_in_every_mode(decide, mode):
    decision = decide("https://example.com/docs", mode)
    assert decision.verdict is ASK
    assert decision.request == "Fetch from example.com"
    assert "https://example.com/docs" in decision.reason
    hint = "plan mode asks" if mode is ApprovalMode.PLAN else "web_fetch:example.com"
    assert hint in decision.reason


@pytest.mark.parametrize("mode", RULED_MODES, ids=lambda m: m.value)
def test_with_network_public_hosts_are_allowed_in_every_mode_but_plan(decide, mode):
    decision = decide("https://example.com/docs", mode, network=True)
    assert decision.verdict is ALLOW
    assert decision.grant.network  # public addresses only: the tool checks what it reaches
    assert not decision.grant.write


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/",
        "http://localhost:3000/",
        "http://api.localhost/",
        "http://[::1]/",
        "http://10.0.0.5/",
        "http://192.168.1.1/admin",
        "http://169.254.169.254/latest/meta-data/",
        "http://2130706433/",
        "http://127.1/",
    ],
)
def test_local_hosts_ask_even_with_network(decide, mode, url):
    decision = decide(url, mode, network=True)
    assert decision.verdict is ASK, decision
    assert "private network" in decision.reason


def test_an_allow_rule_naming_the_host_allows_it(decide):
    for rule in ("web_fetch:docs.python.org", "web_fetch(docs.python.org)"):
        decision = decide("https://docs.python.org/3/library/", allow=[rule])
        assert decision.verdict is ALLOW, rule
        assert not decision.grant.network  # named: whatever addresses the host has
    assert decide("https://python.org/", allow=["web_fetch:docs.python.org"]).verdict is ASK
    assert decide("https://example.com/", allow=["read:docs.python.org"]).verdict is ASK


def test_an_allow_rule_naming_a_local_host_allows_it(decide):
    for mode in RULED_MODES:
        decision = decide("http://127.0.0.1:8123/x", mode, allow=["web_fetch:127.0.0.1"])
        assert decision.verdict is ALLOW
    assert decide("http://127.0.0.1:8123/", allow=["web_fetch:127.0.0.1:8123"]).allowed
    assert not decide("http://127.0.0.1:9999/", allow=["web_fetch:127.0.0.1:8123"]).allowed
    assert decide("http://[::1]:8123/", allow=["web_fetch:[::1]"]).allowed


def test_wildcard_domains(decide):
    allow = ["web_fetch:*.example.com"]
    assert decide("https://docs.example.com/", allow=allow).verdict is ALLOW
    assert decide("https://a.b.example.com/", allow=allow).verdict is ALLOW
    assert decide("https://example.com/", allow=allow).verdict is ASK  # not the apex
    assert decide("https://evilexample.com/", allow=allow).verdict is ASK
    assert decide("https://example.com.evil.net/", allow=allow).verdict is ASK


def test_a_rule_for_every_host_allows_public_hosts_only(decide):
    for allow in (["web_fetch"], ["web_fetch:*"], ["*"]):
        public = decide("https://example.com/", allow=allow)
        assert public.verdict is ALLOW and public.grant.network, allow
        assert decide("http://localhost:8000/", allow=allow).verdict is ASK, allow


def test_deny_rules_win_over_network_and_allow_rules(decide):
    deny = ["web_fetch:*.evil.example"]
    for mode in MODES:
        decision = decide("https://x.evil.example/", mode, network=True, deny=deny)
        assert decision.verdict is DENY
        assert "web_fetch:*.evil.example" in decision.reason
    assert decide("https://good.example/", network=True, deny=deny).verdict is ALLOW
    both = decide("https://x.evil.example/", allow=["web_fetch:x.evil.example"], deny=deny)
    assert both.verdict is DENY
    assert decide("https://example.com/", network=True, deny=["web_fetch"]).verdict is DENY


def test_deny_rules_of_other_tools_do_not_touch_fetches(decide):
    assert decide("https://example.com/", network=True, deny=["shell:curl"]).verdict is ALLOW


def test_host_names_are_compared_in_canonical_form(decide):
    assert decide("https://DOCS.Example.COM./x", allow=["web_fetch:docs.example.com"]).allowed
    assert decide("https://b\u00fccher.de/", allow=["web_fetch:b\u00fccher.de"]).allowed
    assert decide("https://xn--bcher-kva.de/", allow=["web_fetch:b\u00fccher.de"]).allowed


def test_local_host_detection():
    assert is_local_host("localhost") and is_local_host("db.localhost")
    assert is_local_host("0.0.0.0") and is_local_host("100.64.0.1") and is_local_host("fe80::1")
    assert is_local_host("::ffff:127.0.0.1") and is_local_host("0x7f.0.0.1")
    assert not is_local_host("8.8.8.8") and not is_local_host("example.com")
    assert not is_local_host("deadbeef.com")


def test_pattern_ports():
    url = parse_web_url("https://example.com/")
    assert host_matches("example.com:443", url)
    assert not host_matches("example.com:8443", url)
