"""A small web site on loopback for the web_fetch tests: pages of each type, redirects,
a slow answer, an endless body, errors. Plain stdlib (http.server).

`PageServer.url(path)` names a page on 127.0.0.1; `url(path, host="localhost")`
the same page under another host name, which the tool treats as another site.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HTML = b"""<!doctype html>
<html><head><title>Resident test page</title>
<style>body { color: red }</style><script>document.write("hidden script")</script>
</head><body>
<nav><a href="/plain.txt">Plain</a></nav>
<h1>Fetched heading</h1>
<p>A paragraph with <strong>bold</strong> text and a <a href="docs/next.html">relative link</a>.</p>
<ul><li>first item</li><li>second item</li></ul>
<pre><code>print("code block")</code></pre>
<img src="data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk" alt="tiny logo">
</body></html>
"""
PLAIN = "Just plain text.\nSecond line: caf\u00e9.\n"
JSON_BODY = {"name": "resident", "tools": ["web_fetch"], "count": 3}
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 16
LATIN1_HTML = '<html><head><meta charset="iso-8859-1"></head><body><p>Cr\u00e8me br\u00fbl\u00e9e</p></body></html>'
ENDLESS_CAP = 64 * 1024 * 1024  # the endless body stops here even if nobody hangs up
CHUNK = b"x" * 65536


class PageServer:
    def __init__(self) -> None:
        self.release = threading.Event()  # ends the slow page's wait
        self.endless_sent = 0  # bytes of the endless body written before the client left
        self.endless_done = threading.Event()
        self.requests: list[tuple[str, str]] = []  # (Host header, path)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        # A short poll so that shutdown() (every test's teardown) returns at once.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def __enter__(self) -> PageServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                server.requests.append((self.headers.get("Host", ""), self.path))
                route = ROUTES.get(self.path.split("?")[0])
                if route is None and self.path.startswith("/chain/"):
                    route = chain
                if route is None:
                    self.send(404, "text/html", b"<html><body><h1>Not here</h1></body></html>")
                    return
                route(self, server)

            def send(self, status: int, content_type: str | None, body: bytes, **headers) -> None:
                self.send_response(status)
                if content_type is not None:
                    self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for name, value in headers.items():
                    self.send_header(name.replace("_", "-"), value)
                self.end_headers()
                self.wfile.write(body)

            def redirect(self, location: str, status: int = 302) -> None:
                self.send(status, "text/plain", b"moved", Location=location)

        return Handler


def chain(handler, server: PageServer) -> None:
    """/chain/N redirects N times on the same host, then lands on the plain page."""
    left = int(handler.path.rsplit("/", 1)[1])
    handler.redirect("/plain.txt" if left <= 0 else f"/chain/{left - 1}", 301)


def endless(handler, server: PageServer) -> None:
    """A body with no announced length that goes on until the client hangs up."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/plain")
    handler.end_headers()
    try:
        while server.endless_sent < ENDLESS_CAP:
            handler.wfile.write(CHUNK)
            server.endless_sent += len(CHUNK)
    except OSError:
        pass  # the client hung up, as it should once it has enough
    finally:
        server.endless_done.set()


def slow(handler, server: PageServer) -> None:
    server.release.wait(timeout=10)
    try:
        handler.send(200, "text/plain", b"too late")
    except OSError:
        pass


ROUTES = {
    "/page.html": lambda h, s: h.send(200, "text/html; charset=utf-8", HTML),
    "/plain.txt": lambda h, s: h.send(200, "text/plain; charset=utf-8", PLAIN.encode()),
    "/data.json": lambda h, s: h.send(200, "application/json", json.dumps(JSON_BODY).encode()),
    "/image.png": lambda h, s: h.send(200, "image/png", PNG),
    "/report.pdf": lambda h, s: h.send(200, "application/pdf", b"%PDF-1.7\n" + bytes(4096)),
    "/untyped-html": lambda h, s: h.send(200, None, HTML),
    "/untyped-binary": lambda h, s: h.send(200, None, PNG),
    "/latin1.html": lambda h, s: h.send(200, "text/html", LATIN1_HTML.encode("latin-1")),
    "/big.txt": lambda h, s: h.send(200, "text/plain", b"0123456789" * 20_000),
    "/endless.txt": endless,
    "/slow": slow,
    "/error": lambda h, s: h.send(500, "application/json", b'{"error": "database is down"}'),
    "/loop": lambda h, s: h.redirect("/loop"),
    "/to-ftp": lambda h, s: h.redirect("ftp://127.0.0.1/file"),
    "/to-localhost": lambda h, s: h.redirect(s.url("/plain.txt", host="localhost")),
    "/to-other-port": lambda h, s: h.redirect("http://127.0.0.1:9/plain.txt"),
}
