"""URLs the web fetch tool accepts, the host names rules are written against, and which
hosts count as local (loopback, private, link-local: tools.web.addresses judges them).

One module, two users: the tool validates a URL here before anything is sent, and
the permission policy reads the same host from it, so both judge the same name.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import socket
from dataclasses import dataclass

import httpx

from tools.web.addresses import (
    Address,
    NamedAddress,
    is_local_address,
    is_localhost_name,
    same_target,
)

SCHEMES = ("http", "https")
DEFAULT_PORTS = {"http": 80, "https": 443}
GLOB_CHARACTERS = frozenset("*?[")


class URLError(ValueError):
    """A URL the tool will not fetch; the message says why, for the model."""


@dataclass(frozen=True)
class WebURL:
    """A checked http(s) URL: `host` is lowercase ASCII (IDNA for international names,
    no brackets for IPv6), `port` is the one really used."""

    url: httpx.URL
    host: str
    port: int

    @property
    def scheme(self) -> str:
        return self.url.scheme

    @property
    def origin(self) -> tuple[str, int]:
        return self.host, self.port

    def __str__(self) -> str:
        return str(self.url)


def parse_web_url(text: str | httpx.URL) -> WebURL:
    """The URL `text` names, or URLError saying what is wrong with it."""
    raw = str(text).strip()
    try:
        url = httpx.URL(raw)
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise URLError(f"{raw!r} is not a valid URL ({exc})") from None
    if url.scheme not in SCHEMES:
        shown = f"{url.scheme}://" if url.scheme else "no scheme"
        raise URLError(
            f"{raw!r} has {shown}; web_fetch only fetches http:// and https:// URLs "
            "(use the read tool for files)"
        )
    host = url.raw_host.decode("ascii", "replace").lower().rstrip(".")
    if not host:
        raise URLError(f"{raw!r} names no host")
    if url.userinfo:
        raise URLError(f"{raw!r} carries a user name or password; web_fetch does not send them")
    port = url.port if url.port is not None else DEFAULT_PORTS[url.scheme]
    if not 0 < port < 65536:
        raise URLError(f"{raw!r} has port {port}, outside 1-65535")
    return WebURL(url=url.copy_with(fragment=None), host=host, port=port)


def ip_literal(host: str) -> Address | None:
    """The address `host` spells, also in the short forms the C resolver takes
    (`127.1`, `2130706433`, `0x7f.0.0.1`), so none of them passes for a name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if not host or not all(c in "0123456789abcdefx." for c in host):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def is_local_host(host: str) -> bool:
    """Whether `host`, as written, names this machine or a private network (a
    name's addresses are judged when it is resolved: tools.web.transport)."""
    if is_localhost_name(host):
        return True
    address = ip_literal(host)
    return address is not None and is_local_address(address)


def normalize_host_pattern(pattern: str) -> tuple[str, int | None]:
    """A rule's pattern as (lowercase host glob, port or None): `example.com`,
    `*.example.com`, `127.0.0.1:8080`, `[::1]:8080`, `bücher.de`."""
    text = pattern.strip().lower()
    port: int | None = None
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest.startswith(":") and rest[1:].isdigit():
            port = int(rest[1:])
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
        if port_text.isdigit():
            port = int(port_text)
        else:
            host = text
    else:
        host = text
    labels = [_ascii_label(label) for label in host.rstrip(".").split(".")]
    return ".".join(labels), port


def _ascii_label(label: str) -> str:
    if label.isascii():
        return label
    try:
        return label.encode("idna").decode("ascii")
    except UnicodeError:
        return label


def is_glob(pattern: str) -> bool:
    """Whether a rule's host pattern is a glob (`*.example.com`, `**`, `*:80`) rather
    than one host written out."""
    return any(c in GLOB_CHARACTERS for c in normalize_host_pattern(pattern)[0])


def pattern_address(pattern: str) -> NamedAddress | None:
    """The (address, port or None) a pattern names literally (`10.0.0.5`,
    `[::1]:8080`, `127.1`), or None for a host name or a glob."""
    if is_glob(pattern):
        return None
    host, port = normalize_host_pattern(pattern)
    address = ip_literal(host)
    return None if address is None else (address, port)


def host_matches(pattern: str, url: WebURL) -> bool:
    """Whether a rule's pattern covers `url`'s host (and port, when the pattern names
    one), as a deny rule reads it: as broadly as it is written. `*.example.com`
    covers every subdomain of example.com, not example.com; an address covers
    every spelling of it (`127.0.0.1` covers `127.1`, and `::ffff:127.0.0.1`, whose packets
    end up there)."""
    host_glob, port = normalize_host_pattern(pattern)
    if port is not None and port != url.port:
        return False
    if fnmatch.fnmatchcase(url.host, host_glob):
        return True
    named, address = pattern_address(pattern), ip_literal(url.host)
    return named is not None and address is not None and same_target(named[0], address)


def names_host(pattern: str, url: WebURL) -> bool:
    """Whether an allow rule's pattern names `url`'s host (and port, when it names
    one), as an allow rule reads it: as narrowly as it is written.

    A glob grants host names only: never an address (`http://10.0.0.5/`) nor
    `localhost`, so `**`, `*.*` or `*:80` cannot open this machine or a private
    network (and what a name resolves to is judged apart, tools.web.addresses).
    An address is granted only by a pattern that is that address."""
    host_glob, port = normalize_host_pattern(pattern)
    if port is not None and port != url.port:
        return False
    address = ip_literal(url.host)
    if is_glob(pattern):
        if address is not None or is_localhost_name(url.host):
            return False
        return fnmatch.fnmatchcase(url.host, host_glob)
    if address is not None:
        named = pattern_address(pattern)
        return named is not None and named[0] == address
    return url.host == host_glob
