"""The HTTP transport web_fetch uses: it resolves each host itself, checks the
addresses, and connects to an address it checked.

Why not httpx's own transport: a name allowed as a public host may resolve to
127.0.0.1, 10.x or 169.254.169.254 (the cloud metadata service), by mistake or on
purpose (DNS rebinding: a short-lived record that changes between a check and
the connection). Checking the name and then letting the connection resolve it
again leaves that gap; here the address that was checked is the one connected
to. TLS still verifies the certificate against the host name (httpcore takes the
server name from the URL, not from the socket).

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

from tools.web.url import ip_literal, is_local_address


class BlockedAddress(Exception):
    """The host resolves to an address this fetch may not reach."""


class VettedBackend(httpcore.SyncBackend):
    """Connects only to addresses it resolved and checked itself.

    `public_only`: refuse hosts with any non-public address (the fetch was allowed
    for every public host, not for this host by name). Otherwise any address is
    reached: a rule or a person named this host.
    """

    def __init__(self, public_only: bool) -> None:
        super().__init__()
        self.public_only = public_only

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        addresses = self._resolve(host, port)
        local = [a for a in addresses if is_local_address(a)]
        if self.public_only and local:
            raise BlockedAddress(
                f"{host} resolves to {local[0]}, a loopback or private address; such hosts "
                "are fetched only when an allow rule or a person names the host"
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

    def __init__(self, public_only: bool) -> None:
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=True),
            network_backend=VettedBackend(public_only),
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
