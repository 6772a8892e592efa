"""Prometheus metrics of proxied requests, for `GET /metrics`, updated off the request path.

The same counters and histograms as the OpenTelemetry metrics (`proxy/report/telemetry.py`), under
Prometheus names and units, through prometheus_client:

| OpenTelemetry | Prometheus | labels |
|---|---|---|
| `ctxbudget.requests` | `ctxbudget_requests_total` | `model`, `format`, `status_class` |
| `ctxbudget.segments.clamped` | `ctxbudget_segments_clamped_total` | `kind`, `action` |
| `ctxbudget.chars.saved` | `ctxbudget_chars_saved_total` | `kind`, `action` |
| `ctxbudget.tokens.saved` | `ctxbudget_tokens_saved_total` | `kind`, `action` |
| `ctxbudget.money.saved` | `ctxbudget_money_saved_usd_total` (a gauge: it can fall) | `model` |
| `ctxbudget.money.gross_saved` | `ctxbudget_money_gross_saved_usd_total` | `kind`, `action` |
| `ctxbudget.added_latency` (ms) | `ctxbudget_added_latency_seconds` | |
| `ctxbudget.recall.duration` (ms) | `ctxbudget_recall_duration_seconds` | `profile` |
| (Prometheus only) | `ctxbudget_arm_requests_total`, `ctxbudget_arm_cost_usd_total` | `arm` |

`ctxbudget_money_saved_usd_total` is the money saved net of cache effects: each priced
request's cost without ctxbudget minus its cost (the report's `netSavedUsd`), so a memory block
or a cache bust makes it fall; the sum over a window is what the report's first line says.
`ctxbudget_money_gross_saved_usd_total` is the gross figure: the tokens the clamps removed at
the input price, per kind, cache effects ignored.

Like telemetry, it is a sink of the report store: the writer thread that already describes
each finished request adds it to the counters, so the request path does no work for them. It
is on whether or not OpenTelemetry is. Labels are bounded and name no owner, key, URL, path
or text: `kind`, `action`, `format` and `profile` come from fixed sets, `status_class` is
`2xx`…`5xx`, and `model` is the client's model name for the first `MAX_MODELS` names of a
plain shape, `other` after that. Who may read it: `proxy/access/auth.py` `check_metrics_reader`.

Several workers (`ctxbudget serve --workers N`) are separate processes: `serve` runs them in
prometheus_client's multiprocess mode (`shared_between_workers`), each writing its values to
files in a fresh directory, and whichever worker answers a scrape adds up all of them. So
`/metrics` shows the whole server, whichever worker answers.

prometheus_client is imported on first use, not by importing this module: its multiprocess
mode is fixed when it is first imported, from `$PROMETHEUS_MULTIPROC_DIR`, which `serve` sets
before its workers start.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING, Any, get_args

from ctxbudget.caps import SEGMENT_KINDS
from ctxbudget.memory.profiles import RetrievalProfileName
from ctxbudget.proxy.report.tally import COUNT, SAVED, TOKENS, USD

if TYPE_CHECKING:
    from ctxbudget.proxy.report.record import RequestRecord

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""Where prometheus_client's multiprocess mode keeps every process's values."""
MAX_MODELS = 100
"""Distinct `model` label values kept per process; later models are counted as `other`."""
ACTIONS = ("clamped", "would-clamp")
FORMATS = frozenset({"chat", "messages", "responses"})
PROFILES = frozenset(get_args(RetrievalProfileName))
_USAGE_KEYS = (
    ("input", "input"),
    ("cacheRead", "cache_read"),
    ("cacheWrite", "cache_write"),
    ("output", "output"),
)
"""The report entry's usage fields, and their `kind` label."""
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
"""Seconds; the proxy's own time before the upstream gets the request is usually ~1 ms."""
RECALL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Seconds; `deep` recall asks the rewrite model first, which can take seconds."""

# Model names as providers spell them (gpt-4o, claude-sonnet-4-5, anthropic/claude-…,
# llama3:8b, accounts/x/models/y@v2); anything else is `other`, not a label value.
_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,99}")


class Metrics:
    """Prometheus counters and histograms of finished requests: a sink of the report store."""

    def __init__(self, *, max_models: int = MAX_MODELS) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.shared_dir = os.environ.get(MULTIPROCESS_ENV) or None
        """The multiprocess directory when values are shared between workers, else None."""
        self.registry = CollectorRegistry()
        """What a scrape reads: this process's metrics, or every worker's files."""
        into: CollectorRegistry | None = self.registry
        if self.shared_dir:
            from prometheus_client.multiprocess import MultiProcessCollector

            MultiProcessCollector(self.registry, path=self.shared_dir)  # type: ignore[no-untyped-call]
            into = None  # values go to the files; registering them too would count them twice
        self._max_models = max_models
        self._models: set[str] = set()
        self.requests = Counter(
            "ctxbudget_requests",
            "Requests proxied",
            ["model", "format", "status_class"],
            registry=into,
        )
        per_kind = ["kind", "action"]
        self.segments = Counter(
            "ctxbudget_segments_clamped",
            "Segments clamped (or that would be, with the budget off), per kind",
            per_kind,
            registry=into,
        )
        self.chars = Counter(
            "ctxbudget_chars_saved", "UTF-16 chars saved, per kind", per_kind, registry=into
        )
        self.tokens = Counter(
            "ctxbudget_tokens_saved", "Input tokens saved, per kind", per_kind, registry=into
        )
        self.money = Gauge(
            "ctxbudget_money_saved_usd_total",
            "Money saved net of prompt-cache effects: each request's cost without ctxbudget"
            " minus its cost, summed (negative when memories or cache busts cost more; priced"
            " models with provider usage only)",
            ["model"],
            registry=into,
            multiprocess_mode="sum",  # a running total: every worker's, ended ones too
        )
        self.gross = Counter(
            "ctxbudget_money_gross_saved_usd",
            "Gross: tokens the clamps removed at the model's input price, per kind, before"
            " cache effects (priced models only)",
            per_kind,
            registry=into,
        )
        self.added = Histogram(
            "ctxbudget_added_latency_seconds",
            "Time from receiving a request to sending it upstream",
            buckets=LATENCY_BUCKETS,
            registry=into,
        )
        self.recall = Histogram(
            "ctxbudget_recall_duration_seconds",
            "Memory recall time",
            ["profile"],
            buckets=RECALL_BUCKETS,
            registry=into,
        )
        self.busts = Counter(
            "ctxbudget_cache_busts",
            "Requests whose cached prefix broke where the previous request of the session had"
            " it: by the client's own change, or by ctxbudget's (target: 0)",
            ["by"],
            registry=into,
        )
        self.usage = Counter(
            "ctxbudget_provider_tokens",
            "Tokens the provider billed, per class (input, cache_read, cache_write, output)",
            ["model", "class"],
            registry=into,
        )
        self.cost = Counter(
            "ctxbudget_cost_usd",
            "What the provider billed (actual), and the estimate had nothing been clamped or"
            " injected (without_ctxbudget); priced models only",
            ["model", "case"],
            registry=into,
        )
        self.drift = Counter(
            "ctxbudget_mirror_drift_tokens",
            "Prompt tokens the provider read from its cache beyond what the session's cache"
            " mirror predicted (more), or short of it (less): how far the mirror is off",
            ["direction"],
            registry=into,
        )
        self.arm_requests = Counter(
            "ctxbudget_arm_requests",
            "Requests of the holdout's comparison, by arm (budget, holdout): contextBudget.holdout",
            ["arm"],
            registry=into,
        )
        self.arm_cost = Counter(
            "ctxbudget_arm_cost_usd",
            "What the provider billed for the holdout comparison's requests, by arm; priced "
            "models only",
            ["arm"],
            registry=into,
        )
        self._pending: dict[tuple[Any, tuple[str, ...]], float] = {}
        """What the batch's requests added to each counter, by metric and labels
        (`batch_done`)."""
        self._observed: list[tuple[Any, tuple[str, ...], float]] = []
        """The batch's histogram observations (`batch_done`)."""
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        """Labelled children by metric and labels (`_child`): bounded, as models are."""
        for by in ("client", "ctxbudget"):
            self.busts.labels(by)
        for direction in ("more", "less"):
            self.drift.labels(direction)
        # Every kind and action from the start, at 0, so rate() has a series before the
        # first clamp.
        for kind in SEGMENT_KINDS:
            for action in ACTIONS:
                for counter in (self.segments, self.chars, self.tokens, self.gross):
                    counter.labels(kind, action)

    def record(self, r: RequestRecord, body: dict[str, Any]) -> None:
        """Count one finished request; `body` is its report entry (on the writer thread), and
        its segments' sums are its tally's (`r.tally`, which the store makes when the
        request path did not). The counters move when the batch is done (`batch_done`)."""
        pending = self._pending
        wire = r.wire if r.wire in FORMATS else "other"
        model = self._model(r.model)
        key: Any = (self.requests, (model, wire, f"{r.status // 100}xx"))
        pending[key] = pending.get(key, 0) + 1
        action = "clamped" if r.enabled else "would-clamp"
        priced = r.input_price is not None
        # each kind's sums, carried from the conversation's last request (`Tally`)
        by_kind = r.tally.by_kind(action) if r.tally is not None else {}
        for kind, sums in by_kind.items():
            if kind not in SEGMENT_KINDS:
                continue
            count, chars, tokens, usd = sums[COUNT], sums[SAVED], sums[TOKENS], sums[USD]
            labels = (kind, action)
            for metric, amount in (
                (self.segments, count),
                (self.chars, max(0, chars)),
                (self.tokens, max(0, tokens)),
                *(((self.gross, max(0.0, usd)),) if priced else ()),
            ):
                key = (metric, labels)
                pending[key] = pending.get(key, 0) + amount
        if body.get("clientCacheBust"):
            self._add(self.busts, ("client",), 1)
        if body.get("cacheBust"):
            self._add(self.busts, ("ctxbudget",), 1)
        drift = body.get("mirrorDrift")
        if drift:
            self._add(self.drift, ("more" if drift > 0 else "less",), abs(drift))
        usage = body.get("usage")
        if usage:
            for name, value in _USAGE_KEYS:
                self._add(self.usage, (model, value), usage[name])
        if body.get("costUsd") is not None:
            self._add(self.cost, (model, "actual"), max(0.0, body["costUsd"]))
            without = max(0.0, body["withoutCtxbudgetUsd"])
            self._add(self.cost, (model, "without_ctxbudget"), without)
            self._add(self.money, (model,), body["netSavedUsd"])
        held = r.holdout
        if held is not None and not held.chosen:  # a request that chose is in no arm
            self._add(self.arm_requests, (held.arm,), 1)
            if body.get("costUsd") is not None:
                self._add(self.arm_cost, (held.arm,), max(0.0, body["costUsd"]))
        marks = r.marks
        if "start" in marks and "upstream_start" in marks:
            self._observed.append(
                (self.added, (), max(0, marks["upstream_start"] - marks["start"]) / 1e9)
            )
        memory = body.get("memory") or None
        if memory and "recall_start" in marks and "recall_end" in marks:
            profile = memory.get("applied")
            self._observed.append(
                (
                    self.recall,
                    (profile if profile in PROFILES else "other",),
                    max(0, marks["recall_end"] - marks["recall_start"]) / 1e9,
                )
            )

    def _add(self, metric: Any, labels: tuple[str, ...], amount: float) -> None:
        key = (metric, labels)
        self._pending[key] = self._pending.get(key, 0) + amount

    def batch_done(self) -> None:
        """Move the counters by what the batch's requests added: once a counter a batch, not
        once a request (each `inc` takes a lock, and finding a labelled child ~1 µs: ~20 a
        request)."""
        pending, self._pending = self._pending, {}
        observed, self._observed = self._observed, []
        for (metric, labels), amount in pending.items():
            self._child(metric, *labels).inc(amount)
        for metric, labels, value in observed:
            (self._child(metric, *labels) if labels else metric).observe(value)

    def _child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, kept: prometheus_client checks and looks the labels up
        on every call (~5 µs; a request counts up to 20 of them)."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """The exposition for a scrape with this `Accept` header: (body, content type).
        Prometheus text by default, OpenMetrics when the scraper asks for it."""
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type

    def _model(self, model: str | None) -> str:
        if not model:
            return "unknown"
        if model in self._models:
            return model
        if (
            len(self._models) >= self._max_models
            or not _MODEL.fullmatch(model)
            or "//" in model  # a URL, not a model name
        ):
            return "other"
        self._models.add(model)
        return model


@contextlib.contextmanager
def shared_between_workers(
    workers: int, env: MutableMapping[str, str] | None = None
) -> Iterator[str | None]:
    """Set up `$PROMETHEUS_MULTIPROC_DIR` for a server of `workers` processes, before they start.

    More than one: a fresh private directory (removed afterwards) that every worker writes its
    values to and adds up for `/metrics`. One: none, and an inherited value is dropped, lest
    files of another run be added in.
    """
    env = os.environ if env is None else env
    if workers <= 1:
        env.pop(MULTIPROCESS_ENV, None)
        yield None
        return
    path = tempfile.mkdtemp(prefix="ctxbudget-metrics-")
    env[MULTIPROCESS_ENV] = path
    try:
        yield path
    finally:
        env.pop(MULTIPROCESS_ENV, None)
        shutil.rmtree(path, ignore_errors=True)
