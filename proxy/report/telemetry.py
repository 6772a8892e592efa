"""OpenTelemetry traces and metrics of proxied requests, built off the request path.

On when `telemetry.enabled` is true, or when it is left unset and the standard OTLP variables
name an endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`);
`OTEL_SDK_DISABLED=true` turns it off. Everything else comes from the standard variables too
(`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPORTER_OTLP_HEADERS`, …), read by the
SDK itself. Export is OTLP over HTTP (protobuf).

Off, the SDK is not even imported. On, the request path only takes the timestamps it takes
anyway (`RequestRecord.marks`); the report's writer thread, which already counts the tokens
saved, turns each finished request into spans with those timestamps, and updates the metrics.
So tracing adds no work before the upstream gets the request.

One span per request, `chat {model}` (SERVER), with children `parse`, `clamp`, `recall` and
`upstream` (which covers the whole stream). Attributes follow the GenAI semantic conventions
where they fit (`gen_ai.operation.name`, `gen_ai.request.model`, `gen_ai.usage.*`) and are
ctxbudget's own under `ctxbudget.*`. Never a key, a header or message text: only figures,
names of kinds and the proxy's own reasons.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ctxbudget.caps import SEGMENT_KINDS
from ctxbudget.proxy.report.tally import AFTER, BEFORE, COUNT, SAVED, TOKENS, USD

if TYPE_CHECKING:
    from ctxbudget.proxy.config.schema import TelemetryConfig
    from ctxbudget.proxy.report.record import RequestRecord

log = logging.getLogger("ctxbudget.telemetry")

SCOPE = "ctxbudget"


def wanted(cfg: TelemetryConfig, env: Mapping[str, str]) -> bool:
    """Whether telemetry is on for this config and environment."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if cfg.enabled is not None:
        return cfg.enabled
    return bool(
        cfg.endpoint
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


class Telemetry:
    """Turns finished request records into spans and metric points."""

    def __init__(self, tracer_provider: Any, meter_provider: Any) -> None:
        from opentelemetry import trace

        self._trace = trace
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.tracer = tracer_provider.get_tracer(SCOPE)
        meter = meter_provider.get_meter(SCOPE)
        self.requests = meter.create_counter(
            "ctxbudget.requests", unit="{request}", description="Requests proxied"
        )
        self.segments = meter.create_counter(
            "ctxbudget.segments.clamped",
            unit="{segment}",
            description="Segments clamped (or that would be, with the budget off), per kind",
        )
        self.chars = meter.create_counter(
            "ctxbudget.chars.saved", unit="{char}", description="UTF-16 chars saved, per kind"
        )
        self.tokens = meter.create_counter(
            "ctxbudget.tokens.saved", unit="{token}", description="Input tokens saved, per kind"
        )
        self.money = meter.create_up_down_counter(
            "ctxbudget.money.saved",
            unit="USD",
            description="Money saved net of prompt-cache effects: each request's cost without"
            " ctxbudget minus its cost (falls when memories or cache busts cost more)",
        )
        self.gross = meter.create_counter(
            "ctxbudget.money.gross_saved",
            unit="USD",
            description="Gross: tokens the clamps removed at the model's input price, per kind,"
            " before cache effects (priced models only)",
        )
        self.added = meter.create_histogram(
            "ctxbudget.added_latency",
            unit="ms",
            description="Time from receiving a request to sending it upstream",
        )
        self.recall = meter.create_histogram(
            "ctxbudget.recall.duration", unit="ms", description="Memory recall time"
        )
        self.busts = meter.create_counter(
            "ctxbudget.cache_busts",
            unit="{request}",
            description="Requests whose session's cached prefix broke, by the client's change or"
            " ctxbudget's (ctxbudget.cache_bust.by)",
        )
        self.cost = meter.create_counter(
            "ctxbudget.session.cost",
            unit="USD",
            description="What the provider billed (ctxbudget.cost.case=actual) and the estimate"
            " with nothing clamped or injected (without_ctxbudget); priced models only",
        )

    @classmethod
    def from_config(cls, cfg: TelemetryConfig, env: Mapping[str, str]) -> Telemetry | None:
        """OTLP/HTTP exporting telemetry when wanted, else None (and nothing imported)."""
        if not wanted(cfg, env):
            return None
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        # OTEL_SERVICE_NAME (read by the SDK) wins over config, config over "ctxbudget".
        named = "OTEL_SERVICE_NAME" in env
        resource = Resource.create(
            {} if named else {"service.name": cfg.service_name or "ctxbudget"}
        )
        base = cfg.endpoint.rstrip("/") if cfg.endpoint else None
        traces = OTLPSpanExporter(endpoint=f"{base}/v1/traces" if base else None)
        metrics = OTLPMetricExporter(endpoint=f"{base}/v1/metrics" if base else None)
        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(traces))
        reader = PeriodicExportingMetricReader(
            metrics, export_interval_millis=cfg.metrics_interval_seconds * 1000
        )
        meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
        log.info("OpenTelemetry on: OTLP/HTTP to %s", base or "the OTEL_EXPORTER_OTLP_* endpoint")
        return cls(tracer_provider, meter_provider)

    def shutdown(self) -> None:
        """Export what is pending and stop."""
        for provider in (self.tracer_provider, self.meter_provider):
            try:
                provider.shutdown()
            except Exception:  # noqa: BLE001 - an exporter failing at exit must not hang it
                log.warning("telemetry shutdown failed", exc_info=True)

    # -- one finished request ----------------------------------------------------------

    def record(self, r: RequestRecord, body: dict[str, Any]) -> None:
        """Spans and metric points for one request; `body` is its report entry."""
        marks = r.marks
        start, end = marks.get("start"), marks.get("end")
        if start is None or end is None:
            return
        model = r.model or "unknown"
        memory = body.get("memory") or None
        attrs = self._attributes(r, body, memory)
        root = self.tracer.start_span(
            f"chat {model}",
            kind=self._trace.SpanKind.SERVER,
            attributes=attrs,
            start_time=start,
        )
        if r.status >= 500:
            root.set_status(self._trace.Status(self._trace.StatusCode.ERROR, r.upstream_error))
        context = self._trace.set_span_in_context(root)
        for name, begin, finish in (
            ("parse", "start", "parsed"),
            ("clamp", "parsed", "clamped"),
            ("recall", "recall_start", "recall_end"),
            ("upstream", "upstream_start", "end"),
        ):
            if begin in marks and finish in marks:
                child = self.tracer.start_span(name, context=context, start_time=marks[begin])
                if name == "upstream":
                    child.set_attribute("http.response.status_code", r.status)
                    if r.upstream_error:
                        child.set_status(
                            self._trace.Status(self._trace.StatusCode.ERROR, r.upstream_error)
                        )
                child.end(end_time=marks[finish])
        root.end(end_time=end)
        self._metrics(r, body, memory)

    def _attributes(
        self, r: RequestRecord, body: dict[str, Any], memory: dict[str, Any] | None
    ) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": r.route.split("/", 1)[0],
            "http.response.status_code": r.status,
            "ctxbudget.request_id": r.id,
            "ctxbudget.budget.enabled": r.enabled,
            "ctxbudget.stream": r.stream,
            "ctxbudget.segments.seen": body["segmentsSeen"],
            "ctxbudget.segments.clamped": body["clamped"] + body["wouldClamp"],
            "ctxbudget.chars.saved": body["savedChars"] + body["wouldSaveChars"],
            "ctxbudget.tokens.saved": body["savedTokens"] + body["wouldSaveTokens"],
        }
        if r.model:
            attrs["gen_ai.request.model"] = r.model
        if body["inputPricePerMTok"] is not None:
            attrs["ctxbudget.money.gross_saved_usd"] = (body["savedUsd"] or 0) + (
                body["wouldSaveUsd"] or 0
            )
        if body.get("netSavedUsd") is not None:
            attrs["ctxbudget.money.saved_usd"] = body["netSavedUsd"]
        if r.clamp_error:
            attrs["ctxbudget.clamp_error"] = r.clamp_error.split(":", 1)[0]
        # each kind's sums, carried from the conversation's last request (`Tally`)
        sums = r.tally.sums if r.tally is not None else {}
        for kind in SEGMENT_KINDS:
            rows = [(action, row) for (k, action), row in sums.items() if k == kind]
            if not rows:
                continue
            acted = [row for action, row in rows if action != "kept"]
            attrs[f"ctxbudget.{kind}.chars_before"] = sum(row[BEFORE] for _, row in rows)
            attrs[f"ctxbudget.{kind}.chars_after"] = sum(
                row[AFTER] if action == "clamped" else row[BEFORE] for action, row in rows
            )
            attrs[f"ctxbudget.{kind}.chars_saved"] = sum(row[SAVED] for row in acted)
            attrs[f"ctxbudget.{kind}.segments_clamped"] = sum(row[COUNT] for row in acted)
            attrs[f"ctxbudget.{kind}.tokens_saved"] = sum(row[TOKENS] for row in acted)
        if memory:
            budget = memory.get("budget") or {}
            usage = memory.get("usage") or {}
            attrs.update(
                {
                    "ctxbudget.budget_profile.requested": memory["requested"],
                    "ctxbudget.budget_profile.applied": memory["applied"],
                    "ctxbudget.budget_profile.reason": memory["reason"],
                    "ctxbudget.memory.candidates": memory["candidates"],
                    "ctxbudget.memory.injected": memory["injected"],
                    "ctxbudget.memory.tokens": memory["tokens"],
                    "ctxbudget.memory.bound_by": memory["boundBy"],
                    "ctxbudget.memory.budget_tokens": budget.get("tokens", 0),
                    "ctxbudget.monitor.warnings": [str(w) for w in usage.get("warnings", [])],
                }
            )
            if budget.get("boundBy"):
                attrs["ctxbudget.memory.budget_bound_by"] = budget["boundBy"]
        if r.response_id is not None:
            attrs["gen_ai.response.id"] = r.response_id
        if r.response_model is not None:
            attrs["gen_ai.response.model"] = r.response_model
        if r.usage is not None:
            u = r.usage
            # The semantic conventions count cache reads and writes inside input_tokens.
            attrs["gen_ai.usage.input_tokens"] = u.input + u.cache_read + u.cache_write
            attrs["gen_ai.usage.output_tokens"] = u.output
            attrs["gen_ai.usage.cache_read.input_tokens"] = u.cache_read
            attrs["gen_ai.usage.cache_creation.input_tokens"] = u.cache_write
        if r.session is not None:
            attrs["ctxbudget.session.id"] = r.session
            attrs["ctxbudget.session.cache_bust"] = body["cacheBust"] or ""
            attrs["ctxbudget.session.client_cache_bust"] = body["clientCacheBust"]
            attrs["ctxbudget.session.memory_tokens"] = body["memoryTokens"]
            if body["sharedPrefixBlocks"] is not None:
                attrs["ctxbudget.session.shared_prefix_blocks"] = body["sharedPrefixBlocks"]
        if body.get("costUsd") is not None:
            attrs["ctxbudget.session.cost_usd"] = body["costUsd"]
            attrs["ctxbudget.session.without_ctxbudget_usd"] = body["withoutCtxbudgetUsd"]
            attrs["ctxbudget.session.saved_usd"] = body["netSavedUsd"]
        return attrs

    def _metrics(
        self, r: RequestRecord, body: dict[str, Any], memory: dict[str, Any] | None
    ) -> None:
        model = r.model or "unknown"
        self.requests.add(1, {"gen_ai.request.model": model, "http.response.status_code": r.status})
        action = "clamped" if r.enabled else "would-clamp"
        by_kind = r.tally.by_kind(action) if r.tally is not None else {}
        for kind in SEGMENT_KINDS:
            row = by_kind.get(kind)
            if row is None:
                continue
            labels = {"ctxbudget.kind": kind, "ctxbudget.action": action}
            self.segments.add(row[COUNT], labels)
            self.chars.add(row[SAVED], labels)
            self.tokens.add(row[TOKENS], labels)
            if r.input_price is not None:
                self.gross.add(row[USD], labels)
        for by, busted in (("client", body["clientCacheBust"]), ("ctxbudget", body["cacheBust"])):
            if busted:
                self.busts.add(1, {"ctxbudget.cache_bust.by": by})
        if body.get("costUsd") is not None:
            labels = {"gen_ai.request.model": model}
            self.cost.add(body["costUsd"], {**labels, "ctxbudget.cost.case": "actual"})
            self.cost.add(
                body["withoutCtxbudgetUsd"], {**labels, "ctxbudget.cost.case": "without_ctxbudget"}
            )
            self.money.add(body["netSavedUsd"], labels)
        marks = r.marks
        if "upstream_start" in marks:
            self.added.record((marks["upstream_start"] - marks["start"]) / 1e6, {})
        if "recall_start" in marks and "recall_end" in marks and memory:
            self.recall.record(
                (marks["recall_end"] - marks["recall_start"]) / 1e6,
                {"ctxbudget.budget_profile.applied": memory["applied"]},
            )
