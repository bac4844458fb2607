"""Prometheus metrics, in a registry of the app's own (no process globals)."""

import time

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandpod_gateway.web.http_middleware import HttpMiddleware

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.http_requests = Counter(
            "sandpod_gateway_http_requests",
            "HTTP requests answered, by route template, method and status code.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.http_latency = Histogram(
            "sandpod_gateway_http_request_duration_seconds",
            "Time to answer an HTTP request (to the end of the body, so streams count whole).",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.executions = Counter(
            "sandpod_gateway_executions",
            "Executions created through the gateway, by the status they were answered with "
            "(pending/running when the answer did not wait for the end).",
            ["language", "status"],
            registry=self.registry,
        )


def _route_template(scope: Scope) -> str:
    route = scope.get("route")
    if isinstance(route, BaseRoute):
        return str(getattr(route, "path", "unmatched"))
    return "unmatched"


class MetricsMiddleware(HttpMiddleware):
    """Counts and times every HTTP request, labelled by route template (bounded cardinality)."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        super().__init__(app)
        self.metrics = metrics

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        status = 500

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            route, method = _route_template(scope), scope["method"]
            self.metrics.http_requests.labels(route, method, str(status)).inc()
            self.metrics.http_latency.labels(route, method).observe(time.perf_counter() - started)
