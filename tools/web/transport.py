"""The HTTP transport web_fetch uses: it resolves each host itself, judges every
address, and connects to an address it judged.

Why not httpx's own transport: a host allowed by a rule, by `--network` or by a
person may resolve to 127.0.0.1, 10.x or 169.254.169.254 (the cloud metadata
service), by mistake or on purpose (DNS rebinding: a short-lived record that
changes between a check and the connection). Checking the name and then letting
the connection resolve it again leaves that gap; here the address that was
judged is the one connected to, on every connection (each redirect hop that
opens one is judged again). Which addresses pass is tools.web.addresses' `Reach`:
public ones, and non-public ones only where named literally; never one a deny rule
names (`web_fetch:8.8.8.8` refuses every name that resolves there). TLS still verifies
the certificate against the host name (httpcore takes the server name from the
URL, not from the socket).

No proxy: the address check would see only the proxy, so the environment's proxy
variables are not used (docs/SECURITY.md says so).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import typing
from collections.abc import Iterable, Iterator

import httpcore
import httpx

from tools.web.addresses import Reach, rule_host
from tools.web.url import ip_literal


class BlockedAddress(Exception):
    """The host resolves to an address this fetch may not reach."""


class VettedBackend(httpcore.SyncBackend):
    """Connects only to addresses it resolved and judged itself: a host with any
    address `reach` refuses is refused whole (a name that points one of its
    addresses home is not one to trust with the others)."""

    def __init__(self, reach: Reach) -> None:
        super().__init__()
        self.reach = reach

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        addresses = self._resolve(host, port)
        for address in addresses:  # a deny rule first: nothing opens what it names
            rule = self.reach.denial(address, port)
            if rule is None:
                continue
            what = host if ip_literal(host) == address else f"{host} resolves to {address}"
            raise BlockedAddress(
                f"{what}, which the deny rule 'web_fetch:{rule}' names: a denied address is "
                "never fetched, whatever name leads to it or allowed the fetch"
            )
        for address in addresses:
            kind = self.reach.refusal(host, address, port)
            if kind is None:
                continue
            what = (
                f"{host} is {kind}"
                if ip_literal(host) == address
                else f"{host} resolves to {address}, which is {kind}"
            )
            raise BlockedAddress(
                f"{what}: not a public address. It is reached only when the URL or an "
                f"allow rule names that address (web_fetch:{rule_host(address)}); a rule "
                "for a host name, a glob or --network never opens it"
            )
        last_error: Exception | None = None
        for address in addresses:
            try:
                return super().connect_tcp(
                    str(address), port, timeout, local_address, socket_options or []
                )
            except httpcore.ConnectTimeout:
                raise  # the whole connect budget is spent; another address would wait again
            except httpcore.ConnectError as exc:
                last_error = exc
        assert last_error is not None
        raise last_error

    @staticmethod
    def _resolve(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        literal = ip_literal(host)
        if literal is not None:
            return [literal]
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc.strerror or exc}") from exc
        # Keep the resolver's order (it sorts by RFC 6724), without repeats.
        found = dict.fromkeys(str(info[4][0]).split("%")[0] for info in infos)
        return [ipaddress.ip_address(text) for text in found]


class VettedTransport(httpx.BaseTransport):
    """An httpx transport over an httpcore pool with the vetted backend."""

    def __init__(self, reach: Reach) -> None:
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=True),
            network_backend=VettedBackend(reach),
            max_connections=4,
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.SyncByteStream)
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with as_httpx_errors():
            response = self._pool.handle_request(core_request)
        assert isinstance(response.stream, typing.Iterable)
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_Body(response.stream),
            extensions=response.extensions,
        )

    def close(self) -> None:
        self._pool.close()


class _Body(httpx.SyncByteStream):
    def __init__(self, stream: Iterable[bytes]) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        with as_httpx_errors():
            yield from self._stream

    def close(self) -> None:
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()


# httpcore's errors and the httpx classes of the same meaning, most specific first, so
# callers handle one family, as with httpx's own transport.
_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


@contextlib.contextmanager
def as_httpx_errors() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        for core_error, httpx_error in _ERRORS:
            if isinstance(exc, core_error):
                raise httpx_error(str(exc)) from exc
        raise
