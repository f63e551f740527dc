"""Prometheus metrics for /metrics.

One registry per app (not prometheus-client's global one), so several apps in
one process (tests) do not collide. Counters and histograms are updated as
requests run; the KV and queue gauges are read from the engine's stats when
/metrics is scraped, so they are never stale.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

PREFIX = "resident"
# Buckets in seconds: CPU decode steps take tens of milliseconds, a long prefill seconds.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
KNOWN_ROUTES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/responses",
        "/v1/models",
        "/v1/engine/stats",
        "/health",
        "/metrics",
        # What routers call on their workers (engine/server/worker_routes.py).
        "/model_info",
        "/get_model_info",
        "/server_info",
        "/get_server_info",
        "/get_load",
        "/flush_cache",
        "/health_generate",
        "/kv_event_sources",
        # Token ids without generating (engine/server/tokenize_routes.py).
        "/tokenize",
        "/detokenize",
        "/v1/chat/completions/render",
        "/v1/completions/render",
    }
)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        reg = self.registry
        self.http_requests = Counter(
            f"{PREFIX}_http_requests",
            "HTTP requests answered, by route and status code",
            ["route", "status"],
            registry=reg,
        )
        self.requests_finished = Counter(
            f"{PREFIX}_requests_finished",
            "Engine requests (one per choice) that ended, by finish reason",
            ["finish_reason"],
            registry=reg,
        )
        self.prompt_tokens = Counter(
            f"{PREFIX}_prompt_tokens", "Prompt tokens of accepted requests", registry=reg
        )
        self.cached_prompt_tokens = Counter(
            f"{PREFIX}_cached_prompt_tokens",
            "Prompt tokens found in the prefix cache",
            registry=reg,
        )
        self.generation_tokens = Counter(
            f"{PREFIX}_generation_tokens", "Tokens generated", registry=reg
        )
        self.time_to_first_token = Histogram(
            f"{PREFIX}_time_to_first_token_seconds",
            "From request arrival to its first generated token",
            buckets=TTFT_BUCKETS,
            registry=reg,
        )
        self.inter_token_latency = Histogram(
            f"{PREFIX}_inter_token_latency_seconds",
            "Between consecutive generated tokens of one request",
            buckets=ITL_BUCKETS,
            registry=reg,
        )
        self.request_latency = Histogram(
            f"{PREFIX}_request_latency_seconds",
            "From request arrival to its last token",
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self._gauges = {
            name: Gauge(f"{PREFIX}_{name}", help_text, registry=reg)
            for name, help_text in (
                ("kv_capacity_tokens", "Tokens the KV pool holds"),
                ("kv_used_tokens", "KV tokens held by running requests"),
                ("kv_cached_tokens", "KV tokens held only by the prefix cache"),
                ("kv_usage_ratio", "Used KV tokens over capacity"),
                ("prefix_cache_hit_rate", "Prompt tokens served from the prefix cache, as a ratio"),
                ("requests_running", "Requests in the running batch"),
                ("requests_waiting", "Requests in the waiting queue (queue depth)"),
                ("tensor_parallel_size", "Tensor-parallel ranks the engine runs on"),
                ("ranks_alive", "Tensor-parallel ranks alive (a dead one fails the engine)"),
            )
        }

    def observe_http(self, path: str, status: int) -> None:
        route = path if path in KNOWN_ROUTES else "other"
        self.http_requests.labels(route=route, status=str(status)).inc()

    def render(self, stats: dict) -> bytes:
        """The text exposition, with the gauges set from the engine's current stats."""
        capacity = stats.get("capacity_tokens") or 0
        used = stats.get("used_tokens") or 0
        values = {
            "kv_capacity_tokens": capacity,
            "kv_used_tokens": used,
            "kv_cached_tokens": stats.get("cached_tokens") or 0,
            "kv_usage_ratio": used / capacity if capacity else 0.0,
            "prefix_cache_hit_rate": stats.get("cache_hit_rate") or 0.0,
            "requests_running": stats.get("running") or 0,
            "requests_waiting": stats.get("waiting") or 0,
            "tensor_parallel_size": (stats.get("parallel") or {}).get("tp", 1),
            "ranks_alive": (stats.get("parallel") or {}).get("ranks_alive", 1),
        }
        for name, value in values.items():
            self._gauges[name].set(value)
        return generate_latest(self.registry)


class HttpMetricsMiddleware:
    """Counts every HTTP response by route and status (a pure ASGI middleware: streams untouched)."""

    def __init__(self, app, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status_seen: list[int] = []

        async def send_and_count(message) -> None:
            if message["type"] == "http.response.start":
                status_seen.append(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_count)
        finally:
            self.metrics.observe_http(scope.get("path", ""), status_seen[0] if status_seen else 500)
