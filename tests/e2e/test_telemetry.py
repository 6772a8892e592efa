"""The real server exporting OTLP/HTTP to a local receiver that decodes what it got."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.e2e.server import base_config, sdk, serve
from tests.openclaw import openclaw_request
from tests.standin import StandIn, serve_app


class Receiver:
    """An OTLP/HTTP (protobuf) collector: keeps every span and metric name it is sent."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.metrics: dict[str, float] = {}
        self.services: set[str] = set()
        self.lock = threading.Lock()

    def app(self) -> Starlette:
        async def traces(request: Request) -> Response:
            message = ExportTraceServiceRequest()
            message.ParseFromString(await request.body())
            with self.lock:
                for resource in message.resource_spans:
                    self.services.add(_service(resource.resource))
                    for scope in resource.scope_spans:
                        for span in scope.spans:
                            self.spans.append(
                                {
                                    "name": span.name,
                                    "id": span.span_id,
                                    "parent": span.parent_span_id,
                                    "start": span.start_time_unix_nano,
                                    "end": span.end_time_unix_nano,
                                    "attrs": {a.key: _value(a.value) for a in span.attributes},
                                }
                            )
            return Response(b"", media_type="application/x-protobuf")

        async def metrics(request: Request) -> Response:
            message = ExportMetricsServiceRequest()
            message.ParseFromString(await request.body())
            with self.lock:
                for resource in message.resource_metrics:
                    for scope in resource.scope_metrics:
                        for metric in scope.metrics:
                            points = metric.sum.data_points or metric.histogram.data_points
                            total = sum(
                                p.as_int or p.as_double if metric.sum.data_points else p.count
                                for p in points
                            )
                            # cumulative temporality: the latest export holds the total
                            self.metrics[metric.name] = total
            return Response(b"", media_type="application/x-protobuf")

        return Starlette(
            routes=[
                Route("/v1/traces", traces, methods=["POST"]),
                Route("/v1/metrics", metrics, methods=["POST"]),
            ]
        )


def _service(resource: Any) -> str:
    for a in resource.attributes:
        if a.key == "service.name":
            return str(a.value.string_value)
    return ""


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, int]]:
    found = Receiver()
    with serve_app(found.app()) as port:
        yield found, port


def test_the_server_exports_spans_and_metrics_over_otlp_http(
    tmp_path: Path, standin: StandIn, receiver: tuple[Receiver, int]
) -> None:
    found, port = receiver
    config = base_config(tmp_path, standin.base_url)
    config["telemetry"] = {"metricsIntervalSeconds": 0.5}
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_SERVICE_NAME": "ctxbudget-e2e",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    with serve(tmp_path, config, env=env) as server:
        client = sdk(base_url=server.base_url, api_key="sk-x")
        body = openclaw_request(version="9.x", stream=True, model="gpt-4o")
        for _ in client.chat.completions.create(**body):
            pass
        request_id = server.report()["recent"][0]["id"]
        saved = server.report()["totals"]["savedChars"]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with found.lock:
                if found.spans and found.metrics.get("ctxbudget.requests"):
                    break
            time.sleep(0.1)
    with found.lock:
        roots = [s for s in found.spans if not s["parent"]]
        assert [r["name"] for r in roots] == ["chat gpt-4o"]
        root = roots[0]
        children = {s["name"]: s for s in found.spans if s["parent"] == root["id"]}
        metrics = dict(found.metrics)
        services = set(found.services)
    assert services == {"ctxbudget-e2e"}
    assert sorted(children) == ["clamp", "parse", "recall", "upstream"]
    assert children["upstream"]["end"] == root["end"]
    attrs = root["attrs"]
    assert attrs["ctxbudget.request_id"] == request_id
    assert attrs["gen_ai.request.model"] == "gpt-4o"
    assert attrs["ctxbudget.chars.saved"] == saved > 0
    assert metrics["ctxbudget.requests"] == 1
    assert metrics["ctxbudget.added_latency"] == 1
