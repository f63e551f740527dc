"""Addresses judged by what they are (issue 38, item 5): every non-public class,
the IPv6 forms that carry an IPv4 address, glob rules that name host names and never
addresses, and plan mode asking before every fetch. What a fetch really dials is in
test_hostile_web.py."""

from __future__ import annotations

import ipaddress

import pytest

from tools import ApprovalMode, PermissionPolicy, ToolCall, Verdict
from tools.web.addresses import Reach, address_kind
from tools.web.url import host_matches, is_local_host, names_host, parse_web_url

ALLOW, ASK, DENY = Verdict.ALLOW, Verdict.ASK, Verdict.DENY
RULED_MODES = [m for m in ApprovalMode if m is not ApprovalMode.PLAN]

NOT_PUBLIC = {
    "127.0.0.1": "loopback",
    "127.8.9.10": "loopback",
    "::1": "loopback",
    "10.1.2.3": "private",
    "172.20.0.1": "private",
    "192.168.1.1": "private",
    "100.64.0.1": "CGNAT",
    "169.254.1.1": "link-local",
    "fe80::1": "link-local",
    "fc00::1": "unique-local",
    "169.254.169.254": "metadata",
    "168.63.129.16": "metadata",  # Azure's, a public address that answers only inside
    "100.100.100.200": "metadata",
    "fd00:ec2::254": "metadata",
    "0.0.0.0": "unspecified",
    "::": "unspecified",
    "224.0.0.1": "multicast",
    "ff02::1": "multicast",
    "240.0.0.1": "reserved",
    "255.255.255.255": "reserved",
    "192.0.2.1": "reserved",
}
# IPv6 forms that carry an IPv4 address: judged by the address inside.
EMBEDDING = {
    "64:ff9b::a9fe:a9fe": ("NAT64", "metadata"),
    "64:ff9b::7f00:1": ("NAT64", "loopback"),
    "64:ff9b::a00:5": ("NAT64", "private"),
    "64:ff9b:1::a9fe:a9fe": ("local-use NAT64", ""),
    "64:ff9b:1::808:808": ("local-use NAT64", ""),  # refused whole, a public one inside too
    "2002:a9fe:a9fe::1": ("6to4", "metadata"),
    "2002:7f00:1::": ("6to4", "loopback"),
    "::169.254.169.254": ("IPv4-compatible", "metadata"),
    "::127.0.0.1": ("IPv4-compatible", "loopback"),
    "::ffff:169.254.169.254": ("IPv4-mapped", "metadata"),
    "::ffff:10.0.0.1": ("IPv4-mapped", "private"),
    "::ffff:0:7f00:1": ("IPv4-translated", "loopback"),
    "2001:0:4136:e378:8000:63bf:80ff:fffe": ("Teredo", ""),  # client 127.0.0.1
}
PUBLIC = ("8.8.8.8", "93.184.215.14", "2606:4700::1111", "64:ff9b::808:808", "2002:808:808::1")


@pytest.mark.parametrize(("text", "kind"), NOT_PUBLIC.items())
def test_every_non_public_class_is_named(text, kind):
    found = address_kind(ipaddress.ip_address(text))
    assert found is not None and kind.split()[0] in found.replace("cloud metadata", "metadata")
    assert is_local_host(text)


@pytest.mark.parametrize(("text", "why"), EMBEDDING.items())
def test_ipv6_forms_are_judged_by_the_ipv4_inside(text, why):
    form, inner = why
    found = address_kind(ipaddress.ip_address(text))
    assert found is not None and form in found, found
    assert inner.replace("metadata", "cloud metadata") in found
    assert is_local_host(text)


@pytest.mark.parametrize("text", PUBLIC)
def test_public_addresses_pass(text):
    assert address_kind(ipaddress.ip_address(text)) is None
    assert not is_local_host(text)


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


GLOB_RULES = ("web_fetch(*.*)", "web_fetch(**)", "web_fetch(*:80)", "web_fetch:*.*.*.*")
LOCAL_URLS = (
    "http://127.0.0.1/",
    "http://169.254.169.254/latest/meta-data/",
    "http://10.0.0.5/",
    "http://100.100.100.200/",
    "http://localhost/",
    "http://db.localhost/",
    "http://[::1]/",
    "http://[64:ff9b::a9fe:a9fe]/",
    "http://127.1/",
)


@pytest.mark.parametrize("mode", RULED_MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("rule", GLOB_RULES)
@pytest.mark.parametrize("url", LOCAL_URLS)
def test_a_glob_rule_never_grants_a_local_address(decide, mode, rule, url):
    decision = decide(url, mode, allow=[rule])
    assert decision.verdict is ASK, (rule, url, decision)
    assert "this machine or a private network" in decision.reason


@pytest.mark.parametrize("rule", GLOB_RULES[:2])
def test_a_glob_rule_grants_host_names_not_public_addresses(decide, rule):
    named = decide("http://docs.example.com/", allow=[rule])
    assert named.verdict is ALLOW and not named.grant.network
    assert decide("http://8.8.8.8/", allow=[rule]).verdict is ASK  # an address is no name


@pytest.mark.parametrize("url", [u for u in LOCAL_URLS if "localhost" not in u])
def test_with_network_every_local_address_asks(decide, url):
    assert decide(url, network=True).verdict is ASK
    assert decide(url, allow=["web_fetch"]).verdict is ASK


@pytest.mark.parametrize("text", EMBEDDING)
def test_embedding_addresses_ask_even_with_network(decide, text):
    decision = decide(f"http://[{text}]/", network=True)
    assert decision.verdict is ASK, decision


def test_only_a_rule_that_is_the_address_grants_it(decide):
    assert decide("http://127.1:8000/", allow=["web_fetch:127.0.0.1"]).allowed  # any spelling
    assert decide("http://[::1]/", allow=["web_fetch:[::1]"]).allowed
    assert not decide("http://[::ffff:127.0.0.1]/", allow=["web_fetch:127.0.0.1"]).allowed
    assert decide("http://localhost:3000/", allow=["web_fetch:localhost"]).allowed
    assert not decide("http://db.localhost/", allow=["web_fetch:localhost"]).allowed


def test_the_grant_carries_the_addresses_rules_name(decide):
    allow = ["web_fetch:10.0.0.5", "web_fetch:[::1]:8080", "web_fetch:docs.example.com"]
    decision = decide("http://docs.example.com/", allow=[*allow, "web_fetch(*.*)"])
    assert decision.allowed
    assert decision.grant.addresses == {
        (ipaddress.ip_address("10.0.0.5"), None),
        (ipaddress.ip_address("::1"), 8080),
    }


def test_deny_rules_still_read_broadly(decide):
    for rule in ("web_fetch(*.*)", "web_fetch(**)", "web_fetch:127.0.0.1"):
        assert decide("http://127.1/", network=True, deny=[rule]).verdict is DENY, rule
    url = parse_web_url("http://2130706433/")
    assert host_matches("127.0.0.1", url) and not names_host("*.*", url)


@pytest.mark.parametrize(
    ("network", "allow"),
    [
        (False, ()),
        (True, ()),
        (False, ("web_fetch:example.com",)),
        (False, ("web_fetch",)),
        (False, ("*",)),
        (True, ("web_fetch(**)", "web_fetch:127.0.0.1")),
    ],
)
@pytest.mark.parametrize("url", ["https://example.com/?q=secret", "http://127.0.0.1:8000/"])
def test_plan_mode_asks_before_every_fetch(decide, network, allow, url):
    decision = decide(url, ApprovalMode.PLAN, network=network, allow=allow)
    assert decision.verdict is ASK, decision
    assert "plan mode asks before every fetch" in decision.reason and url in decision.reason


def test_plan_mode_still_denies_what_a_deny_rule_names(decide):
    decision = decide("https://example.com/", ApprovalMode.PLAN, network=True, deny=["web_fetch"])
    assert decision.verdict is DENY


def test_the_grant_carries_what_deny_rules_name(decide):
    deny = [
        "web_fetch:8.8.8.8",
        "web_fetch:[::1]:8080",
        "*:10.0.0.5",
        "web_fetch(10.*)",
        "web_fetch:evil.example",  # a name: judged on the URL alone
        "shell:curl",  # another tool's
    ]
    decision = decide("http://docs.example.com/", network=True, deny=deny)
    assert decision.allowed
    assert decision.grant.denied == {
        (ipaddress.ip_address("8.8.8.8"), None),
        (ipaddress.ip_address("::1"), 8080),
        (ipaddress.ip_address("10.0.0.5"), None),
    }
    assert ("10.*", None) in decision.grant.denied_globs


def test_a_denied_address_is_denied_in_every_spelling(decide):
    for url in ("http://8.8.8.8/", "http://134744072/", "http://[::ffff:8.8.8.8]/"):
        for mode in ApprovalMode:
            decision = decide(url, mode, network=True, deny=["web_fetch:8.8.8.8"])
            assert decision.verdict is DENY, (url, mode, decision)
    assert decide("http://[64:ff9b::808:808]/", deny=["web_fetch:8.8.8.8"]).verdict is DENY


def test_reach_refuses_what_a_deny_rule_names_whatever_names_it():
    address = ipaddress.ip_address
    reach = Reach(
        named=frozenset({(address("10.0.0.5"), None)}),
        denied=frozenset({(address("8.8.8.8"), None), (address("10.0.0.5"), 8080)}),
        denied_globs=frozenset({("192.0.2.*", None), ("*", 9000)}),
    )
    assert reach.denial(address("8.8.8.8"), 443) == "8.8.8.8"
    assert reach.denial(address("::ffff:8.8.8.8"), 443) == "8.8.8.8"
    assert reach.denial(address("64:ff9b::808:808"), 80) == "8.8.8.8"
    assert reach.denial(address("2002:808:808::1"), 80) == "8.8.8.8"  # 6to4
    assert reach.denial(address("8.8.4.4"), 443) is None
    assert reach.denial(address("10.0.0.5"), 8080) == "10.0.0.5:8080"  # named, yet denied
    assert reach.denial(address("10.0.0.5"), 80) is None
    assert reach.refusal("wiki.corp", address("10.0.0.5"), 80) is None
    assert reach.denial(address("192.0.2.7"), 80) == "192.0.2.*"
    assert reach.denial(address("1.1.1.1"), 9000) == "*:9000"
    assert reach.denial(address("1.1.1.1"), 9001) is None


def test_a_glob_for_names_is_no_address_glob(decide):
    """`web_fetch(*.*)` denies dotted names; it does not follow `localhost` to 127.0.0.1."""
    deny = ["web_fetch(*.*)", "web_fetch(*:9000)", "web_fetch(*.example.com)"]
    decision = decide("http://localhost:3000/", allow=["web_fetch:localhost"], deny=deny)
    assert decision.allowed and decision.grant.denied_globs == frozenset()
