"""The Starlette app: dependencies, lifespan, the route table and the one error handler.

POST /v1/chat/completions        the pipeline (proxy/pipeline/stages.py), one wire adapter each:
POST /v1/messages                  chat completions, Anthropic Messages (and its
POST /v1/messages/count_tokens     count_tokens), OpenAI Responses (proxy/wire/)
POST /v1/responses
GET  /v1/models                  passed through (proxy/routes/models.py)
GET  /metrics                    Prometheus text (proxy/routes/metrics.py)
GET  /context/budget             the report: JSON, text or the page (proxy/routes/report.py)
GET  /context/budget/requests/{id}
POST|GET /v1/memories, DELETE /v1/memories/{id}   (proxy/routes/memories.py)
GET  /healthz                    (proxy/routes/health.py)

`create_app` builds the shared state and the pipeline and mounts `route_table`; no handler
is written in it, so each route reads, and is tested, in its own module.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute

from ctxbudget.caps import Clamp, clamp_request
from ctxbudget.memory.pg import DatabaseUnavailable
from ctxbudget.proxy.access.guard import BrowserGuard
from ctxbudget.proxy.config.database import open_database
from ctxbudget.proxy.config.schema import ConfigSource
from ctxbudget.proxy.errors import (
    CtxBudgetError,
    InternalError,
    MethodNotAllowed,
    NotFound,
    RequestError,
    ServiceUnavailable,
)
from ctxbudget.proxy.pipeline.offload import Offload
from ctxbudget.proxy.pipeline.relay import CLIENT_GONE
from ctxbudget.proxy.pipeline.stages import Pipeline
from ctxbudget.proxy.report import ReportStore, Sink
from ctxbudget.proxy.report.metrics import Metrics
from ctxbudget.proxy.report.telemetry import Telemetry
from ctxbudget.proxy.routes.health import healthz
from ctxbudget.proxy.routes.memories import MemoryRoutes
from ctxbudget.proxy.routes.metrics import MetricsPage
from ctxbudget.proxy.routes.models import ModelList
from ctxbudget.proxy.routes.report import Reporting
from ctxbudget.proxy.routes.websocket import refuse as refuse_websocket
from ctxbudget.proxy.state import ProxyState
from ctxbudget.proxy.upstream.http import HttpUpstream, UpstreamClient
from ctxbudget.proxy.wire import (
    AnthropicMessages,
    ChatCompletions,
    OpenAIResponses,
    WireFormat,
    for_path,
)

log = logging.getLogger("ctxbudget.proxy")

CHAT = ChatCompletions()


_FROZEN: list[bool] = []

YOUNG_COLLECTION = 10_000
"""Container allocations (net of those freed) between two collections of the youngest
generation; Python's default is 700. A request frees what it made by reference counting
(nothing of it waits in a cycle: tests/proxy/test_collector.py), so what a young collection
finds alive is mostly a growing conversation's newest state (the per-item lists it keeps
between requests, ~650 items each at turn 300): at 700 it walked them every ~5 requests,
0.4–0.5 ms each, and more as the conversation grew. At 10,000 it runs every ~70 requests,
~1.5 ms each (issue 34, docs/benchmarks.md). What it costs: a cycle something does make waits
that much longer to be freed."""


def _collector_start_up() -> None:
    """The garbage collector's policy, once a process. What start-up made lives as long as
    the process: out of the collector's way, or every full collection walks it again (~57,000
    objects, ~10 ms each time); a process that makes several apps (the tests) keeps the later
    ones collectable. Young collections made rarer (`YOUNG_COLLECTION`); a higher threshold
    someone set stays."""
    if not _FROZEN:
        _FROZEN.append(True)
        gc.collect()
        gc.freeze()
        young, *older = gc.get_threshold()
        if young and young < YOUNG_COLLECTION:  # 0: collection turned off; left off
            gc.set_threshold(YOUNG_COLLECTION, *older)


def create_app(
    config: ConfigSource,
    *,
    upstream: UpstreamClient | None = None,
    reports: ReportStore | None = None,
    env: Mapping[str, str] | None = None,
    run: str | None = None,
    clamp: Clamp = clamp_request,
    telemetry: Telemetry | None = None,
    metrics: Metrics | None = None,
    offload: Offload | None = None,
    clock: Callable[[], float] = time.time,
) -> Starlette:
    """The proxy app. Dependencies are injected; defaults are built from `config`.

    Telemetry, when not given, comes from `config` and the OTEL_* environment (or is off);
    the Prometheus metrics of `/metrics` are always on. Both are sinks of the report store,
    so they see every request the report does.
    """
    env = os.environ if env is None else env
    cfg = config.get()
    owns_telemetry = telemetry is None
    if telemetry is None:
        telemetry = Telemetry.from_config(cfg.telemetry, env)
    metrics = metrics or Metrics()
    sinks: list[Sink] = [metrics] if telemetry is None else [metrics, telemetry]
    owns_reports = reports is None
    if reports is None:
        reports = ReportStore(
            open_database(cfg.database, env) or cfg.report.path,
            run=run or env.get("CTXBUDGET_RUN_ID") or secrets.token_hex(6),
            keep_days=cfg.report.keep_days,
            sinks=sinks,
        )
    else:
        reports.sinks.extend(sink for sink in sinks if sink not in reports.sinks)
    state = ProxyState(
        config,
        upstream=upstream or HttpUpstream(),
        reports=reports,
        env=env,
        clamp=clamp,
        clock=clock,
    )
    reporting = Reporting(state)
    pipeline = Pipeline(state, reporting, offload)
    app = Starlette(
        routes=route_table(state, pipeline, reporting, metrics),
        lifespan=Lifespan(
            state=state,
            pipeline=pipeline,
            telemetry=telemetry if owns_telemetry else None,
            owns_reports=owns_reports,
            owns_offload=offload is None,  # one given to create_app may serve other apps too
        ),
        middleware=[Middleware(BrowserGuard, settings=state.settings)],
        exception_handlers={
            ClientDisconnect: _client_gone,
            CtxBudgetError: _error_response,
            DatabaseUnavailable: _error_response,
            HTTPException: _error_response,
            Exception: _error_response,
        },
    )
    app.state.proxy = state
    app.state.offload = pipeline.offload
    app.state.pipeline = pipeline
    return app


def route_table(
    state: ProxyState, pipeline: Pipeline, reporting: Reporting, metrics: Metrics
) -> list[BaseRoute]:
    """Every route of the app, in match order (DESIGN.md's HTTP surface). Each proxied format
    also answers without `/v1`: OpenClaw's `baseUrl` may or may not end in it. A route's name
    is its endpoint's (`serve` for the pipeline's)."""
    chat = pipeline.endpoint(CHAT)
    messages = pipeline.endpoint(AnthropicMessages())
    count_tokens = pipeline.endpoint(AnthropicMessages(counting=True))
    responses = pipeline.endpoint(OpenAIResponses())
    memories = MemoryRoutes(state)
    return [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/chat/completions", chat, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/responses", responses, methods=["POST"]),
        Route("/v1/models", ModelList(state, CHAT).models, methods=["GET"]),
        Route("/metrics", MetricsPage(state, metrics).prometheus, methods=["GET"]),
        Route("/context/budget", reporting.budget, methods=["GET"]),
        Route("/context/budget/requests/{id}", reporting.budget_request, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/v1/memories", memories.add, methods=["POST"]),
        Route("/v1/memories", memories.list, methods=["GET"]),
        Route("/v1/memories/{id}", memories.remove, methods=["DELETE"]),
        WebSocketRoute("/{path:path}", refuse_websocket),  # Codex's Responses WebSocket
    ]


@dataclass(frozen=True, kw_only=True)
class Lifespan:
    """What the app opens at start-up and closes at shutdown: the upstream client, the memory
    store, litellm when routes need it, the offload worker, the report and telemetry."""

    state: ProxyState
    pipeline: Pipeline
    telemetry: Telemetry | None
    """Shut down with the app: only one `create_app` made (a given one is its maker's)."""
    owns_reports: bool
    """Close the report store, or only flush it (one given to create_app outlives the app)."""
    owns_offload: bool

    @contextlib.asynccontextmanager
    async def __call__(self, app: Starlette) -> AsyncIterator[None]:
        state, pipeline = self.state, self.pipeline
        await state.upstream.start()
        settings = state.settings()
        state.stores.warm(settings)  # a database that is down is known before the first request
        if settings.routes or settings.rewrite is not None:
            from ctxbudget.proxy.upstream.litellm import preload_litellm

            preload_litellm()
        _collector_start_up()
        try:
            yield
        finally:
            await state.upstream.close()
            await pipeline.prune.summarizer.close()
            if self.owns_offload:
                await pipeline.offload.close()
            state.stores.close()
            # off the loop: a stream's record whose pricing thread is still running is queued
            # by a callback on this loop (`Recorder.finish`), so waiting here would wait it out
            # and close the store before it came (the record was lost)
            await asyncio.to_thread(state.reports.flush)
            if self.owns_reports:
                state.reports.close()
            if self.telemetry is not None:
                self.telemetry.shutdown()
            state.memo.clear()
            state.conversations.clear()


async def _error_response(request: Request, exc: Exception) -> Response:
    """Every error, as JSON in the shape of the client's wire format: the route's own when an
    endpoint ran, else by path (Anthropic's shape under `/v1/messages`, OpenAI's elsewhere),
    so an SDK raises its own typed error with our message."""
    wire: WireFormat = getattr(request.state, "wire", None) or for_path(request.url.path)
    if isinstance(exc, DatabaseUnavailable):
        exc = ServiceUnavailable(
            f"{exc}; this route needs the database (database.url), proxied requests do not"
        )
    elif isinstance(exc, HTTPException):
        exc = _route_error(request, exc)
    elif not isinstance(exc, CtxBudgetError):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        exc = InternalError(f"internal error in ctxbudget: {exc.__class__.__name__}")
    headers = getattr(exc, "headers", None) or {}
    return JSONResponse(wire.error_body(exc), status_code=exc.status, headers=headers)


async def _client_gone(request: Request, exc: Exception) -> Response:
    """A client that left while its body was read: nobody to answer, and not a bug (it was
    logged as one, with two tracebacks)."""
    log.info("client disconnected while sending %s %s", request.method, request.url.path)
    return Response(status_code=CLIENT_GONE)


def _route_error(request: Request, exc: HTTPException) -> CtxBudgetError:
    """Starlette's 404 (no route) and 405 (a route's other method) as our own errors."""
    error: CtxBudgetError
    if exc.status_code == 404:
        error = NotFound(
            f"no route {request.url.path}: ctxbudget serves "
            "/v1/chat/completions, /v1/messages, /v1/responses, /v1/models, /v1/memories, "
            "/context/budget, /metrics and /healthz"
        )
    elif exc.status_code == 405:
        error = MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}")
    else:
        error = RequestError(str(exc.detail))
        error.status = exc.status_code
    error.headers = dict(exc.headers or {})  # 405's `allow`
    return error
