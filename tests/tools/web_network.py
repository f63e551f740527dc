"""A stand-in internet for the web_fetch tests, which have no network: a resolver that
answers from a table (a different answer per lookup, for DNS rebinding) and public
addresses whose connections land on the loopback page server.

Connections are intercepted where web_fetch's transport hands an address it judged
to httpcore, so `connected` lists every address really dialled, in order: a test
can show that a refused address was never dialled, whatever the tool answered.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence

import httpcore

# Public addresses (Python's is_global, and tools.web.addresses, call them public).
# UP ones are served by the loopback page server; DOWN ones refuse connections; every
# other address but loopback is unreachable.
PUBLIC_UP = ("93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c")
PUBLIC_DOWN = ("93.184.215.15",)


class FakeInternet:
    def __init__(self, monkeypatch) -> None:
        # name -> answers, one per lookup; the last one repeats.
        self.dns: dict[str, list[Sequence[str]]] = {}
        self.lookups: list[str] = []
        self.connected: list[str] = []
        real_lookup = socket.getaddrinfo
        real_connect = httpcore.SyncBackend.connect_tcp

        def lookup(host, port, *args, **kwargs):
            name = host.decode() if isinstance(host, bytes) else host
            if name not in self.dns:
                return real_lookup(host, port, *args, **kwargs)
            self.lookups.append(name)
            answers = self.dns[name]
            answer = answers.pop(0) if len(answers) > 1 else answers[0]
            return [_info(address, port) for address in answer]

        def connect(backend, host, port, *args, **kwargs):
            self.connected.append(host)
            if host in PUBLIC_UP:
                host = "127.0.0.1"
            elif host in PUBLIC_DOWN:
                raise httpcore.ConnectError(f"[Errno 111] Connection refused ({host})")
            elif not ipaddress.ip_address(host).is_loopback:
                # Nothing beyond this machine is dialled for real (169.254.169.254 would
                # hang until the connect timeout); `connected` still shows the attempt.
                raise httpcore.ConnectError(f"[Errno 101] Network is unreachable ({host})")
            return real_connect(backend, host, port, *args, **kwargs)

        monkeypatch.setattr("tools.web.transport.socket.getaddrinfo", lookup)
        monkeypatch.setattr(httpcore.SyncBackend, "connect_tcp", connect)

    def name(self, host: str, *answers: Sequence[str]) -> str:
        """Make `host` resolve to each answer in turn (the last one from then on)."""
        self.dns[host] = list(answers)
        return host


def _info(address: str, port: int) -> tuple:
    if ipaddress.ip_address(address).version == 6:
        return (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0))
    return (socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))
