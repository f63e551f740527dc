"""One GET over HTTP(S): same-host redirects followed, the body streamed up to a byte
cap, everything bounded in time. What comes back is bytes and headers, or a
FetchError whose message is fit for the model; turning bytes into text is
tools.web.tool's business.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from tools.web.addresses import Reach
from tools.web.transport import BlockedAddress, VettedTransport
from tools.web.url import URLError, WebURL, parse_web_url

USER_AGENT = "Mozilla/5.0 (compatible; Resident web_fetch)"
ACCEPT = "text/html,application/xhtml+xml,text/markdown,text/plain,application/json;q=0.9,*/*;q=0.5"


@dataclass(frozen=True)
class FetchLimits:
    """Caps on one fetch: bytes downloaded, characters returned, time, redirects."""

    max_bytes: int = 5 * 1024 * 1024
    default_chars: int = 50_000
    max_chars: int = 200_000
    connect_timeout_s: float = 10.0
    # Between two pieces of the body; the whole fetch has `total_timeout_s`.
    read_timeout_s: float = 30.0
    total_timeout_s: float = 60.0
    max_redirects: int = 10
    # Of an error page (a 404's body), shown to the model.
    error_body_chars: int = 2_000


class FetchError(Exception):
    """The fetch failed; `str()` says why, in words for the model. `data` goes into the
    tool result (a redirect's target, the HTTP status)."""

    def __init__(self, message: str, **data: object) -> None:
        super().__init__(message)
        self.data = data


@dataclass(frozen=True)
class Response:
    """What came back: the final URL after redirects, its headers, the body (cut at the
    byte cap when `cut`), and the redirects taken to get there."""

    url: WebURL
    status: int
    reason: str
    content_type: str
    charset: str | None
    body: bytes
    cut: bool
    declared_bytes: int | None
    redirects: list[str] = field(default_factory=list)
    requested: WebURL | None = None  # the URL asked for (redirects may have led elsewhere)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def mime(self) -> str:
        return self.content_type.split(";")[0].strip().lower()


def _mime(response: httpx.Response) -> str:
    return response.headers.get("content-type", "").split(";")[0].strip().lower()


class Fetcher:
    """Fetches URLs under `limits`. `reach`: the non-public addresses this fetch may
    connect to (those named literally); every other address of every hop is judged
    after resolution and refused unless public (tools.web.transport)."""

    def __init__(
        self,
        limits: FetchLimits,
        *,
        reach: Reach,
        cancel_event: threading.Event | None = None,
    ) -> None:
        self.limits = limits
        self.reach = reach
        self.cancel_event = cancel_event or threading.Event()

    def get(
        self,
        url: WebURL,
        *,
        body_limit: Callable[[str], int] | None = None,
    ) -> Response:
        """GET `url`. `body_limit(mime)`: the most bytes of a body of that type the
        caller needs (0: none, a type it refuses); never more than the byte cap, and
        error pages are read only up to a small cap."""
        limits = self.limits
        deadline = time.monotonic() + limits.total_timeout_s
        timeout = httpx.Timeout(
            connect=limits.connect_timeout_s,
            read=limits.read_timeout_s,
            write=limits.read_timeout_s,
            pool=limits.connect_timeout_s,
        )
        headers = {"User-Agent": USER_AGENT, "Accept": ACCEPT}
        redirects: list[str] = []
        with httpx.Client(
            transport=VettedTransport(self.reach),
            timeout=timeout,
            headers=headers,
            follow_redirects=False,
            trust_env=False,
        ) as client:
            current = url
            for _ in range(limits.max_redirects + 1):
                self._check_time(deadline, current)
                with contextlib.closing(self._send(client, current)) as response:
                    location = response.headers.get("location")
                    if response.is_redirect and location:
                        current = self._redirect(current, response.status_code, location)
                        redirects.append(str(current))
                        continue
                    limit = body_limit(_mime(response)) if body_limit else limits.max_bytes
                    body, cut = self._read_body(current, response, deadline, limit)
                    declared = response.headers.get("content-length", "")
                    return Response(
                        url=current,
                        status=response.status_code,
                        reason=response.reason_phrase,
                        content_type=response.headers.get("content-type", ""),
                        charset=response.charset_encoding,
                        body=body,
                        cut=cut,
                        declared_bytes=int(declared) if declared.isdigit() else None,
                        redirects=redirects,
                        requested=url,
                    )
        raise FetchError(
            f"{url} redirected more than {limits.max_redirects} times "
            f"(last: {redirects[-1]}); not followed further",
            redirects=redirects,
        )

    def _send(self, client: httpx.Client, url: WebURL) -> httpx.Response:
        """The response's headers; its body is read (or not) by the caller."""
        try:
            return client.send(client.build_request("GET", url.url), stream=True)
        except BlockedAddress as exc:
            raise FetchError(f"Not fetched: {exc}") from None
        except httpx.HTTPError as exc:
            raise FetchError(describe_http_error(exc, url, self.limits)) from None

    def _redirect(self, current: WebURL, status: int, location: str) -> WebURL:
        try:
            target = parse_web_url(current.url.join(location))
        except (URLError, httpx.InvalidURL) as exc:
            raise FetchError(
                f"{current} redirected (HTTP {status}) to {location!r}, which is not fetched: "
                f"{exc}",
                status=status,
            ) from None
        if not same_site(current, target):
            raise FetchError(
                f"Not followed: {current} redirected (HTTP {status}) to {target}, on another "
                "host or port. Fetch that URL with web_fetch if it is what you want; it is "
                "checked against the permissions of its own host.",
                status=status,
                redirect=str(target),
            )
        return target

    def _read_body(
        self, url: WebURL, response: httpx.Response, deadline: float, limit: int
    ) -> tuple[bytes, bool]:
        """The body, streamed and cut at `limit` bytes (and the byte cap); and whether
        it was cut."""
        limit = min(limit, self.limits.max_bytes)
        if not response.is_success:
            limit = min(limit, self.limits.error_body_chars * 4)
        body = bytearray()
        if limit <= 0:
            return b"", False
        try:
            for chunk in response.iter_bytes():
                if self.cancel_event.is_set():
                    raise FetchError(f"Interrupted while fetching {url}.")
                self._check_time(deadline, url)
                body += chunk
                if len(body) > limit:
                    return bytes(body[:limit]), True
        except httpx.HTTPError as exc:
            raise FetchError(describe_http_error(exc, url, self.limits)) from None
        return bytes(body), False

    def _check_time(self, deadline: float, url: WebURL) -> None:
        if time.monotonic() > deadline:
            raise FetchError(
                f"Fetching {url} took longer than {self.limits.total_timeout_s:g}s; stopped."
            )


def same_site(current: WebURL, target: WebURL) -> bool:
    """Whether a redirect stays where the permission was given: the same host and port,
    or the plain upgrade from http on port 80 to https on 443."""
    if target.host != current.host:
        return False
    if target.port == current.port:
        return True
    return (current.scheme, current.port, target.scheme, target.port) == ("http", 80, "https", 443)


def describe_http_error(exc: httpx.HTTPError, url: WebURL, limits: FetchLimits) -> str:
    """An httpx error in words for the model: what failed and where."""
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.ConnectTimeout):
        return f"Could not connect to {url.host} within {limits.connect_timeout_s:g}s."
    if isinstance(exc, httpx.TimeoutException):
        return (
            f"{url.host} sent nothing for {limits.read_timeout_s:g}s while fetching {url}; gave up."
        )
    if isinstance(exc, httpx.ConnectError):
        if "CERTIFICATE" in detail.upper() or "SSL" in detail.upper():
            return f"TLS error with {url.host}: {detail}"
        return f"Could not connect to {url.host}: {detail}"
    if isinstance(exc, httpx.ProtocolError):
        return f"{url.host} sent an invalid HTTP response: {detail}"
    if isinstance(exc, httpx.DecodingError):
        return f"Could not decode the response from {url}: {detail}"
    return f"Fetching {url} failed: {type(exc).__name__}: {detail}"
