"""web_fetch against a real HTTP server on loopback: each content type, caps, redirects,
timeouts and errors, all of which come back as tool results, never exceptions."""

from __future__ import annotations

import ipaddress
import json
import socket
import time

import pytest

from tests.tools.web_network import PUBLIC_DOWN, PUBLIC_UP, FakeInternet
from tests.tools.web_server import JSON_BODY, PageServer
from tools import Registry
from tools.sandbox.grants import READ_ONLY, SandboxGrant
from tools.web.addresses import FetchGrant
from tools.web.fetch import FetchLimits
from tools.web.tool import WebFetchTool

# Small caps so the tests are quick; the defaults are checked on their own below.
LIMITS = FetchLimits(
    max_bytes=256 * 1024,
    default_chars=20_000,
    max_chars=200_000,
    connect_timeout_s=5.0,
    read_timeout_s=0.5,
    total_timeout_s=20.0,
    max_redirects=5,
)


@pytest.fixture
def site():
    with PageServer() as server:
        yield server


@pytest.fixture
def fetch(ctx):
    registry = Registry([WebFetchTool(LIMITS)])

    def run(url: str, grant: SandboxGrant | None = None, **arguments):
        extra = {"grant": grant} if grant is not None else {}
        return registry.call("web_fetch", {"url": url, **arguments}, ctx, **extra)

    return run


def test_html_becomes_markdown_with_absolute_links(site, fetch):
    result = fetch(site.url("/page.html"))
    assert result.ok, result.output
    header, _, text = result.output.partition("\n\n")
    assert f"URL: {site.url('/page.html')}" in header
    assert "Status: 200 OK" in header
    assert "Content-Type: text/html; charset=utf-8" in header
    assert "Title: Resident test page" in header
    assert "# Fetched heading" in text
    assert "**bold**" in text
    assert f"[relative link]({site.url('/docs/next.html')})" in text
    assert "- first item" in text and 'print("code block")' in text
    assert "[image: tiny logo]" in text and "base64" not in text
    assert "hidden script" not in text and "color: red" not in text
    assert result.data["status"] == 200 and not result.truncated


def test_plain_text_and_json_come_back_as_they_are(site, fetch):
    plain = fetch(site.url("/plain.txt"))
    assert plain.ok
    assert plain.output.endswith("Just plain text.\nSecond line: caf\u00e9.\n")
    data = fetch(site.url("/data.json"))
    assert data.ok and "Content-Type: application/json" in data.output
    assert json.loads(data.output.partition("\n\n")[2]) == JSON_BODY


def test_a_page_without_a_content_type_is_judged_by_its_bytes(site, fetch):
    html = fetch(site.url("/untyped-html"))
    assert html.ok and "# Fetched heading" in html.output
    binary = fetch(site.url("/untyped-binary"))
    assert not binary.ok and "Not read" in binary.output


def test_the_page_declares_its_own_charset(site, fetch):
    result = fetch(site.url("/latin1.html"))
    assert result.ok and "Cr\u00e8me br\u00fbl\u00e9e" in result.output


@pytest.mark.parametrize(("path", "kind"), [("/image.png", "image/png"), ("/report.pdf", "pdf")])
def test_binary_types_are_refused_without_downloading_them(site, fetch, path, kind):
    result = fetch(site.url(path))
    assert not result.ok
    assert "Not read" in result.output and kind in result.output
    assert "HTML and text" in result.output
    assert result.data["bytes"] == 0  # refused on the header, the body never read


def test_text_is_cut_at_max_chars_and_says_so(site, fetch):
    result = fetch(site.url("/big.txt"), max_chars=1000)
    assert result.ok and result.truncated
    body, _, note = result.output.partition("\n\n")[2].rpartition("\n\n")
    assert body == ("0123456789" * 100)
    assert "showing the first 1,000 of" in note and "max_chars" in note


def test_max_chars_is_bounded(site, fetch):
    result = fetch(site.url("/plain.txt"), max_chars=10_000_000)
    assert not result.ok and "max_chars" in result.output


def test_an_endless_body_is_cut_at_the_byte_cap_while_streaming(site, fetch):
    started = time.monotonic()
    result = fetch(site.url("/endless.txt"), max_chars=200_000)
    assert time.monotonic() - started < 10
    assert result.ok and result.truncated
    assert result.data["bytes"] == LIMITS.max_bytes
    assert "the download stopped after 262,144 bytes" in result.output
    # The client hung up: the server could not push its 64 MiB.
    assert site.endless_done.wait(10)
    assert site.endless_sent < 32 * 1024 * 1024


def test_redirects_on_the_same_host_are_followed(site, fetch):
    result = fetch(site.url("/chain/3"))
    assert result.ok, result.output
    assert f"URL: {site.url('/plain.txt')}" in result.output
    assert f"Redirected from: {site.url('/chain/3')}" in result.output
    assert len(result.data["redirects"]) == 4


def test_a_host_name_is_resolved_and_each_address_tried(site, fetch, monkeypatch):
    """A name with two public addresses: the first refuses, the second answers."""
    internet = FakeInternet(monkeypatch)
    host = internet.name("two.example", [PUBLIC_DOWN[0], PUBLIC_UP[0]])
    result = fetch(site.url("/plain.txt", host=host))
    assert result.ok, result.output
    assert internet.connected == [PUBLIC_DOWN[0], PUBLIC_UP[0]]
    assert site.requests == [(f"two.example:{site.port}", "/plain.txt")]


def test_too_many_redirects_is_an_error(site, fetch):
    result = fetch(site.url("/loop"))
    assert not result.ok
    assert "redirected more than 5 times" in result.output


def test_a_redirect_to_another_host_is_reported_not_followed(site, fetch):
    result = fetch(site.url("/to-localhost"))
    target = site.url("/plain.txt", host="localhost")
    assert not result.ok
    assert "Not followed" in result.output and target in result.output
    assert result.data["redirect"] == target
    assert all(host.startswith("127.0.0.1") for host, _ in site.requests)


def test_a_redirect_to_another_port_is_not_followed(site, fetch):
    result = fetch(site.url("/to-other-port"))
    assert not result.ok and "Not followed" in result.output
    assert result.data["redirect"] == "http://127.0.0.1:9/plain.txt"


def test_a_redirect_to_another_scheme_is_refused(site, fetch):
    result = fetch(site.url("/to-ftp"))
    assert not result.ok and "ftp://" in result.output and "http" in result.output


def test_a_slow_server_times_out(site, fetch):
    started = time.monotonic()
    result = fetch(site.url("/slow"))
    assert time.monotonic() - started < 5
    assert not result.ok and "sent nothing for 0.5s" in result.output


def test_http_errors_carry_status_and_body(site, fetch):
    missing = fetch(site.url("/nowhere"))
    assert not missing.ok and missing.data["status"] == 404
    assert missing.output.startswith(f"HTTP 404 Not Found from {site.url('/nowhere')}")
    assert "Not here" in missing.output
    failed = fetch(site.url("/error"))
    assert not failed.ok and failed.data["status"] == 500
    assert "database is down" in failed.output


def test_a_refused_connection_is_an_error(fetch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = fetch(f"http://127.0.0.1:{port}/")
    assert not result.ok and "Could not connect to 127.0.0.1" in result.output


def test_tls_against_a_plain_http_server_is_an_error(site, fetch):
    result = fetch(f"https://127.0.0.1:{site.port}/plain.txt")
    assert not result.ok and "TLS error with 127.0.0.1" in result.output


def test_a_name_that_does_not_resolve_is_an_error(fetch, monkeypatch):
    def no_such_host(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr("tools.web.transport.socket.getaddrinfo", no_such_host)
    result = fetch("http://no-such-host.invalid/")
    assert not result.ok
    assert "cannot resolve no-such-host.invalid" in result.output


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("file:///etc/passwd", "only fetches http:// and https://"),
        ("ftp://example.com/file", "only fetches http:// and https://"),
        ("javascript:alert(1)", "only fetches http:// and https://"),
        ("example.com/page", "no scheme"),
        ("http:///path", "names no host"),
        ("http://user:secret@example.com/", "user name or password"),
        ("http://[::1", "not a valid URL"),
    ],
)
def test_bad_urls_are_tool_errors(fetch, url, why):
    result = fetch(url)
    assert not result.ok and why in result.output


def test_a_name_that_resolves_home_is_refused_however_the_fetch_was_allowed(
    site, fetch, monkeypatch
):
    """--network, a rule naming the host, a glob rule or a person: a name is granted, never
    the loopback address its DNS gives today. Only the URL itself, or an allow rule naming
    the address (FetchGrant.addresses), opens a local address."""
    public = SandboxGrant(network=True)
    direct = fetch(site.url("/plain.txt"), grant=public)  # never granted so by the policy
    assert not direct.ok and "127.0.0.1 is loopback: not a public" in direct.output

    internet = FakeInternet(monkeypatch)
    host = internet.name("docs.example.com", ["127.0.0.1"])
    url = f"http://{host}:{site.port}/plain.txt"
    for grant in (public, READ_ONLY, FetchGrant(addresses=frozenset())):
        named = fetch(url, grant=grant)
        assert not named.ok and "docs.example.com resolves to 127.0.0.1" in named.output
        assert "web_fetch:127.0.0.1" in named.output
    assert site.requests == [] and internet.connected == []
    rule = FetchGrant(addresses=frozenset({(ipaddress.ip_address("127.0.0.1"), None)}))
    assert fetch(url, grant=rule).ok
    assert fetch(site.url("/plain.txt")).ok  # the URL spells the address: a person saw it


def test_an_interrupted_turn_does_not_fetch(site, fetch, ctx):
    ctx.cancel_event.set()
    result = fetch(site.url("/plain.txt"))
    assert not result.ok and "interrupted" in result.output
    assert site.requests == []


def test_the_default_tool_set_offers_web_fetch_with_its_schema():
    from tools import default_registry

    schema = next(s for s in default_registry().schemas() if s["function"]["name"] == "web_fetch")
    parameters = schema["function"]["parameters"]
    assert parameters["required"] == ["url"]
    assert parameters["properties"]["max_chars"]["maximum"] == FetchLimits().max_chars
