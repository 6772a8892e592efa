"""OpenTelemetry spans and metrics, through the real server with the SDK's in-memory exporters."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ctxbudget.memory import NewMemory, SQLiteMemoryStore
from ctxbudget.proxy.app import create_app
from ctxbudget.proxy.config.schema import ConfigSource, TelemetryConfig
from ctxbudget.proxy.report import ReportStore
from ctxbudget.proxy.report.telemetry import Telemetry, wanted
from tests.openclaw import openclaw_request
from tests.standin import StandIn, run_standin, serve_app

CLIENT_KEY = "sk-client-secret-123"
MEMORY = "Therapy is on Thursdays at 3pm"


@pytest.fixture(scope="module")
def standin() -> Iterator[StandIn]:
    with run_standin() as server:
        yield server


def _turn(question: str, *, stream: bool) -> dict[str, Any]:
    body = openclaw_request(version="9.x", stream=stream, model="gpt-4o")
    body["messages"].append({"role": "user", "content": question})
    if not stream:
        body.pop("stream_options", None)
    return body


@pytest.mark.e2e  # the openai SDK against uvicorn on a port
def test_spans_and_metrics_for_proxied_requests(tmp_path: Path, standin: StandIn) -> None:
    standin.reset()
    path = tmp_path / "c.json"
    path.write_text(
        json.dumps(
            {
                "proxy": {"upstream": {"baseUrl": standin.base_url, "apiKeyEnv": None}},
                "agents": {"defaults": {"contextBudget": {"enabled": True}}},
                "memory": {"store": {"path": str(tmp_path / "m.db")}},
                "report": {"path": str(tmp_path / "r.db")},
            }
        )
    )
    SQLiteMemoryStore(tmp_path / "m.db").add(NewMemory(owner="default", text=MEMORY))
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    telemetry = Telemetry(tracer_provider, MeterProvider(metric_readers=[reader]))
    reports = ReportStore(tmp_path / "r.db", run="t", sinks=[telemetry])
    app = create_app(ConfigSource(path, {}, {}), reports=reports, env={}, telemetry=telemetry)
    with serve_app(app) as port:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=CLIENT_KEY)
        client.chat.completions.create(**_turn("when is therapy?", stream=False))
        chunks = list(client.chat.completions.create(**_turn("therapy day?", stream=True)))
        assert chunks[-1].usage is not None
        client.close()
        reports.flush()
        report = reports.summary(recent=5)

    roots = [s for s in spans.get_finished_spans() if s.parent is None]
    assert [s.name for s in roots] == ["chat gpt-4o", "chat gpt-4o"]
    billed = list(standin.billed)
    for root, entry, usage in zip(roots, reversed(report["recent"]), billed, strict=True):
        attrs = dict(root.attributes or {})
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.request.model"] == "gpt-4o"
        # what the stand-in billed, cache reads counted inside the input as the conventions say
        assert attrs["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
        assert attrs["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        assert attrs["gen_ai.usage.cache_read.input_tokens"] == cached
        assert attrs["gen_ai.usage.cache_creation.input_tokens"] == 0
        assert attrs["ctxbudget.session.id"] == entry["session"]
        assert attrs["ctxbudget.session.cost_usd"] == pytest.approx(entry["costUsd"])
        assert attrs["ctxbudget.session.saved_usd"] == pytest.approx(entry["netSavedUsd"])
        assert attrs["ctxbudget.session.cache_bust"] == ""
        assert attrs["ctxbudget.request_id"] == entry["id"]
        assert attrs["ctxbudget.budget.enabled"] is True
        for kind in ("bootstrap", "web_fetch", "memory"):
            segs = [s for s in entry["segments"] if s["kind"] == kind]
            assert attrs[f"ctxbudget.{kind}.chars_saved"] == sum(s["saved"] for s in segs)
            assert attrs[f"ctxbudget.{kind}.chars_before"] == sum(s["before"] for s in segs)
            assert attrs[f"ctxbudget.{kind}.tokens_saved"] == sum(s["savedTokens"] for s in segs)
        assert attrs["ctxbudget.bootstrap.chars_saved"] > 0
        assert attrs["ctxbudget.money.saved_usd"] == pytest.approx(entry["netSavedUsd"])
        assert attrs["ctxbudget.money.gross_saved_usd"] == pytest.approx(entry["savedUsd"])
        memory = entry["memory"]
        assert attrs["ctxbudget.budget_profile.applied"] == memory["applied"]
        assert attrs["ctxbudget.budget_profile.reason"] == memory["reason"]
        assert attrs["ctxbudget.memory.injected"] == memory["injected"] == 1
        assert attrs["ctxbudget.memory.bound_by"] == memory["boundBy"]

        children = _children(spans.get_finished_spans(), root)
        assert sorted(children) == ["clamp", "parse", "recall", "upstream"]
        upstream = children["upstream"]
        assert upstream.end_time == root.end_time, "the upstream span covers the whole stream"
        assert root.start_time is not None and upstream.start_time is not None
        assert root.start_time <= children["parse"].start_time < upstream.start_time  # type: ignore[operator]
        _no_secrets_or_text(root, *children.values())

    metrics = _points(reader)
    assert metrics[("ctxbudget.requests", ())] == 2
    kind_saved = report["totals"]["byKind"]["bootstrap"]["savedChars"]
    assert metrics[("ctxbudget.chars.saved", ("bootstrap", "clamped"))] == kind_saved
    tokens = report["totals"]["byKind"]["web_fetch"]["savedTokens"]
    assert metrics[("ctxbudget.tokens.saved", ("web_fetch", "clamped"))] == tokens
    assert metrics[("ctxbudget.money.gross_saved", ("bootstrap", "clamped"))] == pytest.approx(
        report["totals"]["byKind"]["bootstrap"]["savedUsd"]
    )
    # first, net of cache effects: what the report's sessions say was saved
    net = sum(r["netSavedUsd"] for r in report["recent"])
    assert metrics[("ctxbudget.money.saved", ())] == pytest.approx(net)
    assert net == pytest.approx(report["totals"]["money"]["savedUsd"])
    assert metrics[("ctxbudget.added_latency", ())] == 2  # histogram: count
    assert metrics[("ctxbudget.recall.duration", ())] == 2
    actual = sum(r["costUsd"] for r in report["recent"])
    assert metrics[("ctxbudget.session.cost", ("actual",))] == pytest.approx(actual)
    assert ("ctxbudget.cache_busts", ()) not in metrics, "no cache bust: nothing counted"


def _children(spans: tuple[ReadableSpan, ...], root: ReadableSpan) -> dict[str, ReadableSpan]:
    root_id = root.context.span_id  # type: ignore[union-attr]
    return {s.name: s for s in spans if s.parent is not None and s.parent.span_id == root_id}


def _no_secrets_or_text(*spans: ReadableSpan) -> None:
    for span in spans:
        flat = json.dumps({k: str(v) for k, v in (span.attributes or {}).items()})
        for secret in (CLIENT_KEY, "Bearer", MEMORY, "therapy", "Project Context"):
            assert secret not in flat, f"{secret!r} leaked into span {span.name}"


def _points(reader: InMemoryMetricReader) -> dict[tuple[str, tuple[str, ...]], float]:
    """Metric name and (kind, action) labels → sum (counters) or count (histograms)."""
    out: dict[tuple[str, tuple[str, ...]], float] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    attrs = dict(point.attributes or {})
                    labels = tuple(
                        str(attrs[k])
                        for k in ("ctxbudget.kind", "ctxbudget.action", "ctxbudget.cost.case")
                        if k in attrs
                    )
                    value = getattr(point, "value", None)
                    if value is None:
                        value = point.count  # type: ignore[union-attr]
                    key = (metric.name, labels)
                    out[key] = out.get(key, 0) + value
    return out


@pytest.mark.parametrize(
    ("enabled", "env", "on"),
    [
        (None, {}, False),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        (True, {}, True),
        (False, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
        (True, {"OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_when_telemetry_is_on(enabled: bool | None, env: dict[str, str], on: bool) -> None:
    assert wanted(TelemetryConfig(enabled=enabled), env) is on


@pytest.mark.e2e  # a fresh interpreter of its own
def test_off_means_the_sdk_is_never_imported(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from ctxbudget.proxy.app import create_app\n"
        "from ctxbudget.proxy.config.schema import ConfigSource\n"
        f"p = Path({str(tmp_path / 'c.json')!r})\n"
        f'p.write_text(\'{{"report": {{"path": "{tmp_path / "r.db"}"}}}}\')\n'
        "create_app(ConfigSource(p, {}, {}), env={})\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"
