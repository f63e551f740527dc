"""Which addresses a fetch may reach: every address is judged after resolution, by
what it is, never by the rule that let the fetch run.

Not public: loopback, private (RFC 1918, IPv6 unique-local), link-local, shared
(CGNAT), unspecified, multicast, reserved, documentation, and the cloud metadata
services (169.254.169.254, fd00:ec2::254, Azure's 168.63.129.16, which is a public
address reachable only from inside Azure). IPv6 addresses that carry an IPv4 one
(IPv4-mapped, IPv4-compatible, SIIT-translated, NAT64 64:ff9b::/96, 6to4 2002::/16)
are judged by the IPv4 address inside, since that is where the packets end up (a
NAT64 gateway or 6to4 relay forwards them there). The local-use NAT64 prefix
64:ff9b:1::/48 and Teredo 2001::/32 are refused whole: where the IPv4 sits inside
a local-use prefix is the operator's choice, and Teredo is a tunnel to a client
behind NAT.

Python's own `is_global` is not enough: it changes between versions, and 3.11
calls 2002::/16, 64:ff9b:1::/48, ::a9fe:a9fe and ff02::1 global.

A non-public address is reached only where someone named it literally: the URL's
host is that address (the policy let that URL run: a rule naming the address, or
a person), an allow rule names it (`web_fetch:10.0.0.5`, which `FetchGrant`
carries to the tool), or the host is `localhost` and the address is loopback. A
glob rule (`*.*`, `**`, `*:80`) names host names, never addresses.

A deny rule works the other way and wins: an address it names (`web_fetch:8.8.8.8`,
`web_fetch:10.0.0.5:8080`, in any spelling, or an IPv6 form that carries it) or an
address glob it holds (`web_fetch(10.*)`) is refused on every connection, whatever
name led there and whatever allowed the fetch (`Reach.denial`).
"""

from __future__ import annotations

import fnmatch
import ipaddress
from dataclasses import dataclass

from tools.sandbox.grants import SandboxGrant

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
# (address, port): None for any port.
NamedAddress = tuple[Address, int | None]
# A deny rule's host glob and port (None for any), as tools.web.url normalizes it.
HostGlob = tuple[str, int | None]

# Names that resolve to this machine by convention (RFC 6761), whatever DNS says.
LOCAL_NAMES = ("localhost",)
LOCAL_SUFFIXES = (".localhost",)

_net = ipaddress.ip_network

# Cloud metadata services: instance credentials live behind these.
METADATA = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, Oracle, DigitalOcean, ...
        "169.254.170.2",  # AWS ECS task metadata
        "168.63.129.16",  # Azure WireServer: public, yet answers only inside Azure
        "100.100.100.200",  # Alibaba Cloud
        "192.0.0.192",  # Oracle Cloud (classic)
        "fd00:ec2::254",  # AWS over IPv6
    )
)

IPV4_KINDS: tuple[tuple[ipaddress.IPv4Network, str], ...] = (
    (_net("0.0.0.0/8"), "unspecified ('this network')"),
    (_net("127.0.0.0/8"), "loopback"),
    (_net("10.0.0.0/8"), "private (RFC 1918)"),
    (_net("172.16.0.0/12"), "private (RFC 1918)"),
    (_net("192.168.0.0/16"), "private (RFC 1918)"),
    (_net("100.64.0.0/10"), "shared (CGNAT)"),
    (_net("169.254.0.0/16"), "link-local"),
    (_net("224.0.0.0/4"), "multicast"),
    (_net("240.0.0.0/4"), "reserved"),
)
IPV6_KINDS: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_net("::/128"), "unspecified"),
    (_net("::1/128"), "loopback"),
    (_net("64:ff9b:1::/48"), "local-use NAT64 (64:ff9b:1::/48)"),
    (_net("2001::/32"), "a Teredo tunnel (2001::/32)"),
    (_net("fc00::/7"), "unique-local (private)"),
    (_net("fe80::/10"), "link-local"),
    (_net("fec0::/10"), "site-local"),
    (_net("ff00::/8"), "multicast"),
)
# IPv6 forms that carry an IPv4 address in their last 32 bits.
TAIL_EMBEDDING: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_net("::ffff:0:0/96"), "IPv4-mapped"),
    (_net("::ffff:0:0:0/96"), "IPv4-translated (SIIT)"),
    (_net("64:ff9b::/96"), "NAT64"),
    (_net("::/96"), "IPv4-compatible"),  # after :: and ::1, which are judged first
)
SIX_TO_FOUR = _net("2002::/16")


def embedded_ipv4(address: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, str] | None:
    """The IPv4 address an IPv6 one carries and the form's name, or None."""
    for network, form in TAIL_EMBEDDING:
        if address in network:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF), form
    if address in SIX_TO_FOUR:
        return ipaddress.IPv4Address((int(address) >> 80) & 0xFFFFFFFF), "6to4"
    return None


def targets(address: Address) -> tuple[Address, ...]:
    """Where packets for `address` end up: the address, and for an IPv6 form that
    carries an IPv4 address (::ffff:8.8.8.8, NAT64, 6to4), that IPv4 address too."""
    if isinstance(address, ipaddress.IPv6Address) and int(address) > 1:  # not :: or ::1
        inner = embedded_ipv4(address)
        if inner is not None:
            return address, inner[0]
    return (address,)


def same_target(first: Address, second: Address) -> bool:
    """Whether two addresses are one destination (`8.8.8.8` and `::ffff:8.8.8.8`)."""
    return any(a == b for a in targets(first) for b in targets(second))


def address_kind(address: Address) -> str | None:
    """Why `address` is not public ("loopback", "the cloud metadata service", ...), or
    None for a public internet address."""
    if address in METADATA:
        return "the cloud metadata service"
    if isinstance(address, ipaddress.IPv6Address):
        if address.scope_id:  # fe80::1%eth0: a scope only makes sense on a local link
            return "scoped to a local interface"
        for network, kind in IPV6_KINDS:
            if address in network:
                return kind
        inner = embedded_ipv4(address)
        if inner is not None:
            v4, form = inner
            kind = address_kind(v4)
            article = "an" if form[0] in "AEIOU" else "a"
            return None if kind is None else f"{article} {form} address of {v4}, which is {kind}"
    else:
        for network, kind in IPV4_KINDS:
            if address in network:
                return kind
    if address.is_multicast:
        return "multicast"
    if not address.is_global:  # documentation, benchmarking, other IANA special ranges
        return "reserved (not a public internet address)"
    return None


def is_local_address(address: Address) -> bool:
    """Anything that is not a public internet address (see `address_kind`)."""
    return address_kind(address) is not None


def is_localhost_name(host: str) -> bool:
    return host in LOCAL_NAMES or host.endswith(LOCAL_SUFFIXES)


@dataclass(frozen=True)
class FetchGrant(SandboxGrant):
    """A web fetch's grant: besides SandboxGrant's flags, the non-public addresses
    allow rules name literally (`web_fetch:10.0.0.5`, `web_fetch:[::1]:8080`), which
    the fetch may reach whatever host name led there."""

    addresses: frozenset[NamedAddress] = frozenset()
    # What deny rules name that an address can match: addresses written out and
    # globs (`web_fetch(10.*)`), refused on every connection (`Reach.denial`).
    denied: frozenset[NamedAddress] = frozenset()
    denied_globs: frozenset[HostGlob] = frozenset()


@dataclass(frozen=True)
class Reach:
    """What one fetch may connect to: public addresses, plus those named literally
    (`named`), plus loopback when the host is `localhost`; never an address a deny
    rule names (`denied`, `denied_globs`), whatever else holds."""

    named: frozenset[NamedAddress] = frozenset()
    denied: frozenset[NamedAddress] = frozenset()
    denied_globs: frozenset[HostGlob] = frozenset()

    def denial(self, address: Address, port: int) -> str | None:
        """The pattern of the deny rule that names `address` on `port` (`8.8.8.8`,
        `[::1]:8080`, `10.*`), or None. An IPv6 form that carries a denied IPv4
        address is denied too: its packets end up there."""
        for named, named_port in self.denied:
            if named_port in (None, port) and same_target(named, address):
                return _pattern(rule_host(named), named_port)
        for glob, glob_port in self.denied_globs:
            if glob_port not in (None, port):
                continue
            if any(fnmatch.fnmatchcase(str(a), glob) for a in targets(address)):
                return _pattern(glob, glob_port)
        return None

    def refusal(self, host: str, address: Address, port: int) -> str | None:
        """Why `host`'s `address` may not be reached on `port`, or None."""
        kind = address_kind(address)
        if kind is None or (address, None) in self.named or (address, port) in self.named:
            return None
        # localhost is this machine by convention: its loopback addresses are what the
        # rule or the person named. Nothing else it may resolve to (/etc/hosts, DNS).
        plain_loopback = address.is_loopback and not isinstance(
            getattr(address, "ipv4_mapped", None), ipaddress.IPv4Address
        )
        if plain_loopback and is_localhost_name(host):
            return None
        return kind


def rule_host(address: Address) -> str:
    """An address as a rule writes it: `10.0.0.5`, `[::1]`."""
    return f"[{address}]" if address.version == 6 else str(address)


def _pattern(host: str, port: int | None) -> str:
    return host if port is None else f"{host}:{port}"
