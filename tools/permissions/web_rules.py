"""How the permission policy judges a web fetch: by the URL's host, the same in every
mode but plan mode.

A GET changes nothing in the workspace, but it reaches the network, which is off
unless the user turned it on, and its URL can carry what the agent read out of the
repository. So, first match wins:

1. a deny rule whose host pattern matches (`web_fetch:example.com`,
   `web_fetch(*.example.com)`, an address in any spelling), or one naming the tool
   alone, denies, in every mode;
2. plan mode (`planning`: also a plan's read-only subagents) asks before every
   fetch, whatever the rules and `--network` say: a plan is made before anything
   is approved, and a URL is a way out for data;
3. an allow rule whose pattern names the host allows. A glob (`*.example.com`,
   `**`, `*.*`, `*:80`) names host names only, never an address or `localhost`;
   only a pattern that is the address itself (`web_fetch:127.0.0.1`) allows a URL
   that spells one;
4. `--network`, an allow rule `web_fetch` (no pattern, or `*`) or `*` allows every
   public host; loopback and private hosts still ask;
5. anything else asks. The request names the host alone ("Fetch from HOST"), so
   "allow for this session" covers the host, whatever path comes next.

However a fetch was allowed, the tool judges every address a host resolves to
(tools.web.addresses): a non-public one is reached only when the URL or an allow
rule names it literally, and no address a deny rule names (`web_fetch:8.8.8.8`,
an IPv6 form carrying it, or an address glob such as `web_fetch(10.*)`) is reached
at all, whatever name leads there; the decision's grant (`FetchGrant`) carries the
addresses allow rules name and those deny rules name. A rule for a name is a rule
for a name, never for whatever the name's DNS says today.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tools.base import ToolAccess
from tools.permissions.approval import Decision, Rule, Verdict
from tools.web.addresses import FetchGrant, HostGlob, NamedAddress
from tools.web.url import (
    URLError,
    WebURL,
    host_matches,
    is_glob,
    is_local_host,
    names_host,
    normalize_host_pattern,
    parse_web_url,
    pattern_address,
)

EVERY_HOST = (None, "*")  # patterns of a rule that names no host in particular
# What an address glob is written with (`10.*`, `192.168.?.*`, `fe80:*`).
ADDRESS_GLOB_CHARACTERS = frozenset("0123456789abcdef.:*?[]!-")


def judge_fetch(
    tool: str,
    access: ToolAccess,
    *,
    planning: bool,
    network: bool,
    allow: Sequence[Rule],
    deny: Sequence[Rule],
) -> Decision:
    request = access.summary
    try:
        url = parse_web_url(access.url or "")
    except URLError as exc:
        return Decision(Verdict.DENY, str(exc), request)
    for rule in deny:
        if rule.covers_tool(tool) and (rule.pattern is None or host_matches(rule.pattern, url)):
            return Decision(Verdict.DENY, f"denied by rule '{rule}'", request)
    denied, denied_globs = denied_addresses(tool, deny)
    grant = FetchGrant(
        addresses=named_addresses(tool, allow), denied=denied, denied_globs=denied_globs
    )
    local = is_local_host(url.host)
    if planning:
        where = " (this machine or a private network)" if local else ""
        return Decision(
            Verdict.ASK,
            f"plan mode asks before every fetch, whatever the rules say: {url} would reach "
            f"{url.host}{where}, and a URL can carry what the agent read",
            request,
            grant,
        )
    for rule in allow:
        if rule.names_tool(tool) and rule.pattern not in EVERY_HOST:
            if names_host(rule.pattern or "", url):
                return Decision(
                    Verdict.ALLOW, f"allowed by the allow rule '{rule}'", request, grant
                )
    # Every public host: `network` in the grant says so (what reaches the tool is the
    # same: its addresses are judged after resolution either way).
    public = dataclasses.replace(grant, network=True)
    blanket = next((r for r in allow if r.covers_tool(tool) and r.pattern in EVERY_HOST), None)
    if not local and network:
        return Decision(
            Verdict.ALLOW, "network access is on (--network): public hosts", request, public
        )
    if not local and blanket is not None:
        return Decision(
            Verdict.ALLOW, f"allowed by the allow rule '{blanket}': public hosts", request, public
        )
    if local:
        why = (
            f"{url.host} is this machine or a private network; fetching {url} needs approval "
            f"or an allow rule naming exactly that host (web_fetch:{_rule_host(url)}); "
            "a glob or --network does not cover it"
        )
    else:
        why = (
            f"the network is off: fetching {url} needs approval (or --network, or an allow "
            f"rule web_fetch:{_rule_host(url)})"
        )
    return Decision(Verdict.ASK, why, request, grant)


def named_addresses(tool: str, allow: Sequence[Rule]) -> frozenset[NamedAddress]:
    """The (address, port or None) pairs this tool's allow rules name literally."""
    found = set()
    for rule in allow:
        if rule.names_tool(tool) and rule.pattern not in EVERY_HOST:
            named = pattern_address(rule.pattern or "")
            if named is not None:
                found.add(named)
    return frozenset(found)


def denied_addresses(
    tool: str, deny: Sequence[Rule]
) -> tuple[frozenset[NamedAddress], frozenset[HostGlob]]:
    """What this tool's deny rules name that an address can match: addresses written
    out (`web_fetch:8.8.8.8`, any spelling) and address globs (`web_fetch(10.*)`: hex
    digits, dots and colons only, a digit among them; not `*.*`, a glob for names,
    which would take `localhost`'s 127.0.0.1 along), each with its port or None. The
    rules judged the URL's host above; the tool judges every address the host
    resolves to against these, on every connection (tools.web.transport)."""
    addresses: set[NamedAddress] = set()
    globs: set[HostGlob] = set()
    for rule in deny:
        if not rule.covers_tool(tool) or rule.pattern in EVERY_HOST:
            continue  # no pattern: the rule denied every fetch already
        named = pattern_address(rule.pattern or "")
        if named is not None:
            addresses.add(named)
        elif is_glob(rule.pattern or ""):
            host_glob, port = normalize_host_pattern(rule.pattern or "")
            if set(host_glob) <= ADDRESS_GLOB_CHARACTERS and any(c.isdigit() for c in host_glob):
                globs.add((host_glob, port))
    return frozenset(addresses), frozenset(globs)


def _rule_host(url: WebURL) -> str:
    return f"[{url.host}]" if ":" in url.host else url.host
