"""The `web_fetch` tool: fetch an http(s) URL and return its text.

HTML comes back as Markdown, plain text and JSON as they are; images, PDFs and
other binaries are refused. It is the agent's own HTTP client, not a command, so
it never runs in the shell's sandbox and the shell's network setting is not
changed by it; the permission policy decides per host (tools.permissions.policy).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from tools.base import Arguments, Effect, Tool, ToolAccess, ToolResult
from tools.context import ToolContext
from tools.sandbox.grants import READ_ONLY, SandboxGrant
from tools.web.addresses import FetchGrant, Reach
from tools.web.fetch import Fetcher, FetchError, FetchLimits, Response
from tools.web.html_text import html_to_markdown
from tools.web.url import URLError, WebURL, ip_literal, parse_web_url

DEFAULT_LIMITS = FetchLimits()
HTML_TYPES = ("text/html", "application/xhtml+xml")
# Textual types outside text/*: returned as they are.
TEXT_TYPES = (
    "application/json",
    "application/ld+json",
    "application/xml",
    "application/javascript",
    "application/ecmascript",
    "application/x-javascript",
    "application/yaml",
    "application/x-yaml",
    "application/toml",
    "application/x-sh",
    "application/sql",
    "application/graphql",
)
TEXT_SUFFIXES = ("+json", "+xml", "+yaml")
# UTF-8 spends at most this many bytes on a character: text past `max_chars` of
# them is never shown, so it is not downloaded.
MAX_BYTES_PER_CHAR = 4


class WebFetchArgs(Arguments):
    url: str = Field(
        min_length=1,
        max_length=8192,
        description="The http:// or https:// URL to fetch.",
    )
    max_chars: int | None = Field(
        default=None,
        ge=500,
        le=DEFAULT_LIMITS.max_chars,
        description=(
            f"Most characters of text to return (default {DEFAULT_LIMITS.default_chars:,}, "
            f"at most {DEFAULT_LIMITS.max_chars:,})."
        ),
    )

    @field_validator("url")
    @classmethod
    def _fetchable(cls, value: str) -> str:
        try:
            parse_web_url(value)
        except URLError as exc:
            raise ValueError(str(exc)) from None
        return value.strip()


class WebFetchTool(Tool):
    name = "web_fetch"
    description = (
        "Fetch an http(s) URL and return its text: HTML as Markdown (links made absolute), "
        "plain text and JSON as they are; images, PDFs and other binary files are refused. "
        "Returns the final URL, HTTP status and content type. Redirects to another host "
        "are not followed: the result names the new URL, to fetch with another call. "
        "The user must allow network access or the host."
    )
    effect = Effect.READ
    Args = WebFetchArgs

    def __init__(self, limits: FetchLimits = DEFAULT_LIMITS) -> None:
        self.limits = limits

    def access(self, args: WebFetchArgs) -> ToolAccess:
        url = parse_web_url(args.url)
        # The request names the host alone: "allow for this session" then covers the host.
        return ToolAccess(effect=self.effect, summary=f"Fetch from {url.host}", url=str(url))

    def run(self, args: WebFetchArgs, ctx: ToolContext) -> ToolResult:
        return self.run_granted(args, ctx, READ_ONLY)

    def run_granted(self, args: WebFetchArgs, ctx: ToolContext, grant: SandboxGrant) -> ToolResult:
        """Public addresses are reached whatever the grant; a non-public one only where
        it is named literally (`reach_for`)."""
        if ctx.cancel_event.is_set():
            return ToolResult.error("Not run: the turn was interrupted.")
        max_chars = min(args.max_chars or self.limits.default_chars, self.limits.max_chars)
        url = parse_web_url(args.url)
        reach = reach_for(url, grant)
        fetcher = Fetcher(self.limits, reach=reach, cancel_event=ctx.cancel_event)
        try:
            response = fetcher.get(
                url, body_limit=lambda mime: bytes_needed(mime, max_chars, self.limits)
            )
        except FetchError as exc:
            return ToolResult.error(str(exc), url=str(url), **exc.data)
        return page_result(response, max_chars, self.limits)


def reach_for(url: WebURL, grant: SandboxGrant) -> Reach:
    """What this fetch may connect to besides public addresses: the address the URL
    spells, if it does (the policy lets such a URL run only for a rule naming the
    address or a person who saw it), and the addresses allow rules name literally.
    Not the URL's address under `grant.network` (allowed as one of every public
    host): the policy never grants that to a local address, and were it to, this
    still refuses. Redirects stay on the URL's host, so this holds for every hop.
    What deny rules name stays out on every connection, named or not."""
    if not isinstance(grant, FetchGrant):
        grant = FetchGrant(network=grant.network)
    named = grant.addresses
    literal = ip_literal(url.host)
    if literal is not None and not grant.network:
        named = named | {(literal, None)}
    return Reach(named=frozenset(named), denied=grant.denied, denied_globs=grant.denied_globs)


def page_result(response: Response, max_chars: int, limits: FetchLimits) -> ToolResult:
    """The response as the model sees it: a header block, then the text."""
    data = {
        "url": str(response.url),
        "status": response.status,
        "content_type": response.content_type,
        "bytes": len(response.body),
        "redirects": response.redirects,
    }
    kind = content_kind(response.mime, response.body)
    header = [
        f"URL: {response.url}",
        f"Status: {response.status} {response.reason}".rstrip(),
        f"Content-Type: {response.content_type or '(none given)'}",
    ]
    if response.redirects and response.requested is not None:
        header.append(f"Redirected from: {response.requested}")
    if kind is None:
        size = response.declared_bytes or len(response.body)
        what = response.mime or "binary data"
        message = (
            f"Not read: {response.url} is {what} ({size:,} bytes{'+' if response.cut else ''}); "
            "web_fetch returns only HTML and text (plain, Markdown, JSON, XML)."
        )
        if not response.ok:
            message = f"HTTP {response.status} {response.reason} from {response.url}.\n{message}"
        return ToolResult.error(message, **data)
    title, text = page_text(response, kind)
    if title:
        header.append(f"Title: {title}")
    if not response.ok:
        excerpt = text[: limits.error_body_chars]
        more = " [cut]" if len(text) > len(excerpt) or response.cut else ""
        body = f"\n\n{excerpt}{more}" if excerpt.strip() else ""
        return ToolResult.error(
            f"HTTP {response.status} {response.reason} from {response.url}.\n"
            + "\n".join(header[2:])
            + body,
            **data,
        )
    notes = []
    if len(text) > max_chars:
        more = "+" if response.cut else ""  # the download was cut too: there is more
        notes.append(
            f"[truncated: showing the first {max_chars:,} of {len(text):,}{more} characters; "
            f"max_chars goes up to {limits.max_chars:,}]"
        )
        text = text[:max_chars]
    if response.cut:
        total = f" of {response.declared_bytes:,}" if response.declared_bytes else ""
        notes.append(f"[truncated: the download stopped after {len(response.body):,}{total} bytes]")
    output = "\n".join(header) + "\n\n" + text
    if notes:
        output += "\n\n" + "\n".join(notes)
    return ToolResult.success(output, truncated=bool(notes), **data, chars=len(text))


def bytes_needed(mime: str, max_chars: int, limits: FetchLimits) -> int:
    """How much of a body of type `mime` to download: none of a refused type; of text,
    what can hold `max_chars` characters; of HTML (or an unnamed type, which may be
    HTML), up to the byte cap, since markup can outweigh the text many times."""
    kind = declared_kind(mime)
    if kind is None:
        return 0
    if kind == "text":
        return min(max_chars * MAX_BYTES_PER_CHAR, limits.max_bytes)
    return limits.max_bytes


def declared_kind(mime: str) -> str | None:
    """What a content type says: "html", "text", "sniff" (none given: the bytes decide),
    or None for a type that is not read (images, PDFs, archives, octet-streams)."""
    if not mime:
        return "sniff"
    if mime in HTML_TYPES:
        return "html"
    if mime.startswith("text/") or mime in TEXT_TYPES or mime.endswith(TEXT_SUFFIXES):
        return "text"
    return None


def content_kind(mime: str, body: bytes) -> str | None:
    """How to read a body: as "html", as "text", or not at all (None). A response
    without a content type is judged by its first bytes: markup, text that decodes as
    UTF-8, or binary."""
    kind = declared_kind(mime)
    if kind != "sniff":
        return kind
    head = body[:1024]
    if b"\x00" in head:
        return None
    if head.lstrip().lower().startswith((b"<!doctype html", b"<html")):
        return "html"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:  # more than a character cut at the sample's end
            return None
    return "text"


def page_text(response: Response, kind: str) -> tuple[str | None, str]:
    """(title, text) of a response already known to be HTML or text."""
    if kind == "html":
        if response.charset:
            html: str | bytes = decode(response.body, response.charset)
        else:
            html = response.body  # BeautifulSoup reads <meta charset> itself
        page = html_to_markdown(html, str(response.url))
        return page.title, page.markdown
    return None, decode(response.body, response.charset or "utf-8")


def decode(body: bytes, charset: str) -> str:
    try:
        return body.decode(charset, errors="replace")
    except LookupError:  # a charset Python does not know
        return body.decode("utf-8", errors="replace")
