"""How the permission policy judges a web fetch: by the URL's host, not by the mode.

A GET changes nothing in the workspace, but it reaches the network, which is off
unless the user turned it on, and its URL can carry what the agent read out of the
repository. So, in every approval mode (read-only and plan included):

1. a deny rule whose host pattern matches (`web_fetch:example.com`,
   `web_fetch(*.example.com)`), or one naming the tool alone, denies;
2. an allow rule whose host pattern matches allows, for whatever addresses the
   host has: the user named it (an intranet name, `127.0.0.1` for a local server);
3. `--network`, an allow rule `web_fetch` (no pattern, or `*`) or `*` allows every
   public host; loopback and private hosts still ask, and the fetch refuses a
   public name that resolves to such an address (the decision's grant says
   `network`: tools.web.transport reads it), so a page cannot steer the agent to
   the machine's own services or the cloud metadata address;
4. anything else asks. The request names the host alone ("Fetch from HOST"), so
   "allow for this session" covers the host, whatever path comes next.

Patterns are host globs, lowercase, optionally with a port (`127.0.0.1:8080`):
`*.example.com` covers every subdomain of example.com, not example.com itself.
"""

from __future__ import annotations

from collections.abc import Sequence

from tools.base import ToolAccess
from tools.permissions.approval import Decision, Rule, Verdict
from tools.sandbox.bubblewrap import READ_ONLY, SandboxGrant
from tools.web.url import URLError, host_matches, is_local_host, parse_web_url

# The grant of a fetch allowed for every public host: tools.web reaches public
# addresses only. A fetch allowed for its host by name gets READ_ONLY (no flag).
PUBLIC_HOSTS = SandboxGrant(network=True)
EVERY_HOST = (None, "*")  # patterns of a rule that names no host in particular


def judge_fetch(
    tool: str,
    access: ToolAccess,
    *,
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
    for rule in allow:
        if rule.names_tool(tool) and rule.pattern not in EVERY_HOST:
            if host_matches(rule.pattern or "", url):
                return Decision(Verdict.ALLOW, f"allowed by the allow rule '{rule}'", request)
    local = is_local_host(url.host)
    blanket = next((r for r in allow if r.covers_tool(tool) and r.pattern in EVERY_HOST), None)
    if not local and network:
        return Decision(
            Verdict.ALLOW, "network access is on (--network): public hosts", request, PUBLIC_HOSTS
        )
    if not local and blanket is not None:
        return Decision(
            Verdict.ALLOW,
            f"allowed by the allow rule '{blanket}': public hosts",
            request,
            PUBLIC_HOSTS,
        )
    if local:
        why = (
            f"{url.host} is this machine or a private network; fetching {url} needs approval "
            f"or an allow rule naming the host (web_fetch:{url.host})"
        )
    else:
        why = (
            f"the network is off: fetching {url} needs approval (or --network, or an allow "
            f"rule web_fetch:{url.host})"
        )
    return Decision(Verdict.ASK, why, request, READ_ONLY)
