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
rule names it literally; the decision's grant (`FetchGrant`) carries the
addresses allow rules name. A rule for a name is a rule for a name, never for
whatever the name's DNS says today.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tools.base import ToolAccess
from tools.permissions.approval import Decision, Rule, Verdict
from tools.web.addresses import FetchGrant, NamedAddress
from tools.web.url import (
    URLError,
    WebURL,
    host_matches,
    is_local_host,
    names_host,
    parse_web_url,
    pattern_address,
)

EVERY_HOST = (None, "*")  # patterns of a rule that names no host in particular


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
    grant = FetchGrant(addresses=named_addresses(tool, allow))
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


def _rule_host(url: WebURL) -> str:
    return f"[{url.host}]" if ":" in url.host else url.host
