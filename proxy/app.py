"""The Starlette app: routes, the request path, and the one error handler.

POST /v1/chat/completions   parse → (chat command?) → clamp → forward → relay → record
GET  /v1/models             passed through
GET  /context/budget        the report (JSON, or text)
GET  /context/budget/requests/{id}
GET  /healthz
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from caps import ClampResult, Segment, clamp_request
from memory import DEFAULT_OWNER
from proxy import command
from proxy.body import ChatBody, parse_chat_body
from proxy.config import ConfigSource
from proxy.errors import (
    BadRequest,
    ClampError,
    CtxBudgetError,
    NotFound,
    PayloadTooLarge,
    Unauthorized,
    UpstreamError,
)
from proxy.memories import MemoryRoutes
from proxy.models import input_price
from proxy.page import render_html
from proxy.render import build_report, render_text
from proxy.report import ReportStore, RequestRecord, segment_tokens_saved, usd
from proxy.settings import Settings, settings_for
from proxy.telemetry import Telemetry
from proxy.tokens import TokenCounter
from proxy.upstream import Upstream, UpstreamResponse, forward_request_headers

log = logging.getLogger("ctxbudget.proxy")

ANALYSIS_DAYS = 7.0
"""Window of the `analyze` recommendations in the report."""
PAGE_REQUESTS = 200
"""Latest requests on the report page (its savings-over-time plot)."""

Clamp = Callable[..., ClampResult]
"""`clamp_request`'s signature: `(request, caps, *, tools) -> ClampResult`."""

HEADER_PREFIX = "x-context-budget"


class Proxy:
    """Everything a request needs: config, upstream client, report store, environment."""

    def __init__(
        self,
        config: ConfigSource,
        *,
        upstream: Upstream,
        reports: ReportStore,
        env: Mapping[str, str],
        clamp: Clamp = clamp_request,
    ) -> None:
        self.clamp = clamp
        self.tokens = TokenCounter()  # event loop only; counts are cached per text
        self.memories = MemoryRoutes(self)
        self.config = config
        self.upstream = upstream
        self.reports = reports
        self.env = env
        self._settings: tuple[int, Settings] | None = None

    def settings(self) -> Settings:
        """Settings derived from the current config, recomputed only when it changes."""
        cfg = self.config.get()
        cached = self._settings
        if cached is None or cached[0] != id(cfg):
            cached = (id(cfg), settings_for(cfg, self.env))
            self._settings = cached
        return cached[1]

    # -- auth ----------------------------------------------------------------------------

    def check_key(self, request: Request, settings: Settings, *, browser: bool = False) -> str:
        """The owner the request acts for; 401 when proxy keys are set and none matches.

        With `browser` (the report page), HTTP Basic also works, the key as the password:
        the 401 asks the browser for it.
        """
        if not settings.proxy_keys:
            return DEFAULT_OWNER
        header = request.headers.get("authorization")
        given = _bearer(header) or (_basic_password(header) if browser else None)
        if given is not None:
            for key, owner in settings.proxy_keys.items():
                if secrets.compare_digest(given, key):
                    return owner
        error = Unauthorized(
            "missing or unknown proxy key: send 'Authorization: Bearer <key>' with one of "
            f"the keys in ${settings.proxy_keys_env}"
            + (" (in a browser: any user name, the key as the password)" if browser else "")
        )
        if browser:
            error.headers = {"www-authenticate": 'Basic realm="ctxbudget report"'}
        raise error

    def upstream_authorization(self, request: Request, settings: Settings) -> str | None:
        if settings.upstream_api_key:
            return f"Bearer {settings.upstream_api_key}"
        if settings.proxy_keys:
            return None  # the client's header holds a proxy key, not a provider key
        return request.headers.get("authorization")

    # -- routes --------------------------------------------------------------------------

    async def chat_completions(self, request: Request) -> Response:
        started = time.perf_counter()
        marks = {"start": time.time_ns()}  # phase times for telemetry spans
        settings = self.settings()
        owner = self.check_key(request, settings)
        raw = await _read_body(request, settings.max_body_bytes)
        body = parse_chat_body(raw)
        marks["parsed"] = time.time_ns()
        request_id = "cb-" + secrets.token_hex(8)
        enabled = _enabled(request, settings)
        model = body.get("model")
        stream = body.get("stream") is True

        mode = command.find_command(body.messages)
        if mode is not None:
            return await self._answer_command(
                mode, request_id, model, stream, body, settings, request
            )

        result, clamp_error = self._clamp(body.messages, settings, enabled)
        marks["clamped"] = marks["recall_start"] = time.time_ns()
        segments = result.segments if result else ()
        if not enabled:
            segments = tuple(_would(s) for s in segments)
        messages = body.messages
        if enabled and result is not None and result.changed:
            messages = result.request["messages"]
        requested = _choice(request, "profile", ("lean", "balanced", "deep", "auto"))
        complexity = _choice(request, "complexity", ("simple", "medium", "complex", "multi-system"))
        extra_words, rewrite_note = await self.memories.rewrite(
            messages, owner, settings, requested=requested, env=self.env
        )
        messages, recalled = self.memories.recall_into(
            messages,
            owner,
            settings,
            budget_on=enabled,
            agent=request.headers.get(f"{HEADER_PREFIX}-agent"),
            requested=requested,
            extra_words=extra_words,
            rewrite_note=rewrite_note,
            complexity=complexity,
            model=model,
        )
        marks["recall_end"] = time.time_ns()
        if messages is not body.messages:
            out = body.encode(messages)
        else:
            out = raw  # byte-identical: budget off, nothing to clamp, or a clamp failed open
        encoding = settings.encoding_for(model)
        route = settings.route_for(model)
        price = input_price(route.model if route else model)
        # Counted here for the x-context-budget-saved-tokens header: ~0.1 ms per 1,000 chars
        # the first time a text is seen, a cache hit on every later turn that resends it.
        seg_tokens = tuple(segment_tokens_saved(self.tokens, s, encoding) for s in segments)
        headers = _budget_headers(request_id, enabled, segments, clamp_error)
        _money_headers(headers, enabled, segments, seg_tokens, price)
        if recalled is not None:
            headers[f"{HEADER_PREFIX}-memories"] = str(recalled["injected"])
            headers[f"{HEADER_PREFIX}-profile"] = recalled["applied"]

        record = _Recorder(
            self.reports,
            id=request_id,
            model=model,
            enabled=enabled,
            stream=stream,
            segments=segments,
            encoding=encoding,
            clamp_error=clamp_error,
            started=started,
            recalled=recalled,
            segment_tokens=seg_tokens,
            input_price=price,
            marks=marks,
        )
        marks["upstream_start"] = time.time_ns()
        try:
            if route is not None:
                from proxy.providers import litellm_completion

                record.route = route.model
                return await litellm_completion(
                    body.to_dict(messages),
                    route,
                    stream=stream,
                    headers=headers,
                    record=record,
                    env=self.env,
                )
            upstream = await self.upstream.request(
                "POST",
                settings.upstream_url("/chat/completions"),
                body=out,
                headers=forward_request_headers(
                    request.headers, self.upstream_authorization(request, settings)
                ),
                connect_timeout=settings.connect_timeout,
                read_timeout=settings.read_timeout,
            )
        except UpstreamError as exc:
            exc.headers = {**exc.headers, **headers}
            record.finish(exc.status, upstream_error=exc.message)
            raise
        if stream:
            return StreamingResponse(
                _relay(upstream, record),
                status_code=upstream.status,
                headers={**upstream.headers, **headers},
            )
        try:
            data = await upstream.read()
        except Exception as exc:
            record.finish(502, upstream_error=str(exc))
            raise UpstreamError(f"upstream connection broke while answering: {exc}") from exc
        if record.keep_tail:
            record.tail = data
        record.finish(upstream.status)
        return Response(data, status_code=upstream.status, headers={**upstream.headers, **headers})

    def _clamp(
        self, messages: list[Any], settings: Settings, enabled: bool
    ) -> tuple[ClampResult | None, str | None]:
        try:
            request = {"messages": messages}
            return self.clamp(request, settings.caps, tools=settings.tool_names), None
        except Exception as exc:  # a clamp bug must not lose the user's request
            message = f"{exc.__class__.__name__}: {exc}"
            log.exception(
                "clamp failed; %s",
                "refusing (failClosed)"
                if settings.fail_closed
                else "forwarding the request untouched",
            )
            if settings.fail_closed and enabled:
                raise ClampError(
                    f"clamping failed and agents.defaults.contextBudget.failClosed is true, so "
                    f"nothing was sent upstream: {message}"
                ) from exc
            return None, message

    async def _answer_command(
        self,
        mode: command.CommandMode,
        request_id: str,
        model: str | None,
        stream: bool,
        body: ChatBody,
        settings: Settings,
        request: Request,
    ) -> Response:
        report = await self.report(settings, request)
        text = (
            orjson.dumps(report, option=orjson.OPT_INDENT_2).decode()
            if mode == "json"
            else render_text(report)
        )
        headers = _budget_headers(request_id, settings.enabled, (), None)
        headers[f"{HEADER_PREFIX}-command"] = "context-budget"
        name = model or "ctxbudget"
        if stream:
            options = body.get("stream_options")
            usage = isinstance(options, dict) and bool(options.get("include_usage"))
            return StreamingResponse(
                command.completion_stream(
                    text, model=name, request_id=request_id, include_usage=usage
                ),
                media_type="text/event-stream",
                headers=headers,
            )
        return Response(
            command.completion(text, model=name, request_id=request_id),
            media_type="application/json",
            headers=headers,
        )

    async def report(
        self, settings: Settings, request: Request, *, recent: int | None = None
    ) -> dict[str, Any]:
        # Waiting for the writer and reading SQLite block: keep them off the event loop.
        def read() -> tuple[dict[str, Any], dict[str, Any]]:
            self.reports.flush()
            summary = self.reports.summary(recent=recent or settings.recent_requests)
            return summary, self.memories.analysis(settings, days=ANALYSIS_DAYS)

        summary, analysis = await asyncio.to_thread(read)
        report = build_report(summary, settings=settings.describe(self.config))
        report["analysis"] = analysis
        report["page"] = str(request.base_url).rstrip("/") + "/context/budget"
        return report

    async def models(self, request: Request) -> Response:
        settings = self.settings()
        self.check_key(request, settings)
        upstream = await self.upstream.request(
            "GET",
            settings.upstream_url("/models"),
            body=None,
            headers=forward_request_headers(
                request.headers, self.upstream_authorization(request, settings)
            ),
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.read_timeout,
        )
        data = await upstream.read()
        return Response(data, status_code=upstream.status, headers=upstream.headers)

    async def budget(self, request: Request) -> Response:
        settings = self.settings()
        fmt = request.query_params.get("format")
        if fmt not in (None, "json", "text", "html"):
            raise BadRequest(
                f"format must be 'json', 'text' or 'html', got {fmt!r}", param="format"
            )
        accept = request.headers.get("accept", "")
        if fmt is None and "json" not in accept:
            # a browser asks for text/html first; curl and SDKs for */* or JSON
            fmt = "html" if "text/html" in accept else "text" if "text/plain" in accept else None
        self.check_key(request, settings, browser=fmt == "html")
        if fmt == "html":
            report = await self.report(settings, request, recent=PAGE_REQUESTS)
            return HTMLResponse(render_html(report))
        report = await self.report(settings, request)
        if fmt == "text":
            return PlainTextResponse(render_text(report))
        return JSONResponse(report)

    async def budget_request(self, request: Request) -> Response:
        settings = self.settings()
        self.check_key(request, settings)
        request_id = request.path_params["id"]

        def read() -> dict[str, Any] | None:
            self.reports.flush()
            return self.reports.request(request_id)

        found = await asyncio.to_thread(read)
        if found is None:
            raise NotFound(
                f"no request {request_id!r} in the report (it keeps the latest ones; "
                "ids come from the x-context-budget-request-id header)",
                param="id",
            )
        return JSONResponse(found)

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})


class _Recorder:
    """Collects what happened to one request and queues it for the report, exactly once."""

    def __init__(
        self,
        reports: ReportStore,
        *,
        id: str,
        model: str | None,
        enabled: bool,
        stream: bool,
        segments: tuple[Segment, ...],
        encoding: str,
        clamp_error: str | None,
        started: float,
        recalled: dict[str, Any] | None = None,
        segment_tokens: tuple[int, ...] = (),
        input_price: float | None = None,
        marks: dict[str, int] | None = None,
    ) -> None:
        self.reports = reports
        self.recalled = recalled
        self.fields: dict[str, Any] = dict(
            id=id,
            model=model,
            enabled=enabled,
            stream=stream,
            segments=segments,
            encoding=encoding,
            clamp_error=clamp_error,
            segment_tokens=segment_tokens,
            input_price=input_price,
        )
        self.route = "openai"
        self.started = started
        self.done = False
        self.marks = marks if marks is not None else {}
        self.keep_tail = reports.telemetry is not None
        """Keep the upstream's usage-bearing bytes (for gen_ai.usage.* span attributes)."""
        self.tail: bytes | None = None

    def finish(self, status: int, *, upstream_error: str | None = None) -> None:
        if self.done:
            return
        self.done = True
        self.marks["end"] = time.time_ns()
        self.reports.add(
            RequestRecord(
                ts=time.time(),
                marks=self.marks,
                response_tail=self.tail,
                status=status,
                duration_ms=(time.perf_counter() - self.started) * 1000,
                upstream_error=upstream_error,
                route=self.route,
                extra={"worker": os.getpid(), "memory": self.recalled},
                **self.fields,
            )
        )


async def _relay(upstream: UpstreamResponse, record: _Recorder) -> AsyncIterator[bytes]:
    """Relay upstream SSE bytes as they arrive; close upstream if the client goes away."""
    completed = False
    error: str | None = None
    try:
        keep = record.keep_tail
        async for chunk in upstream.iter_chunks():
            if keep and b'"usage"' in chunk:
                record.tail = chunk
            yield chunk
        completed = True
    except Exception as exc:  # upstream broke mid-stream: the status line is already sent
        error = f"upstream stream broke: {exc.__class__.__name__}: {exc}"
        log.warning("%s", error)
        body = UpstreamError(error).to_dict()
        yield b"data: " + orjson.dumps(body) + b"\n\n"
    finally:
        if completed:
            upstream.release()
        else:
            upstream.close()  # client disconnected or upstream broke: drop the connection
        record.finish(
            upstream.status if completed else 499 if error is None else 502,
            upstream_error=error if error else None if completed else "client disconnected",
        )


def _would(segment: Segment) -> Segment:
    return replace(segment, action="would-clamp") if segment.action == "clamped" else segment


def _budget_headers(
    request_id: str, enabled: bool, segments: tuple[Segment, ...], clamp_error: str | None
) -> dict[str, str]:
    clamped = [s for s in segments if s.action == "clamped"]
    would = [s for s in segments if s.action == "would-clamp"]
    headers = {
        f"{HEADER_PREFIX}-request-id": request_id,
        f"{HEADER_PREFIX}-enabled": "true" if enabled else "false",
        f"{HEADER_PREFIX}-clamped": str(len(clamped)),
        f"{HEADER_PREFIX}-saved-chars": str(sum(s.saved for s in clamped)),
        f"{HEADER_PREFIX}-memories": "0",
    }
    if not enabled:
        headers[f"{HEADER_PREFIX}-would-clamp"] = str(len(would))
        headers[f"{HEADER_PREFIX}-would-save-chars"] = str(sum(s.saved for s in would))
    if clamp_error:
        headers[f"{HEADER_PREFIX}-clamp-error"] = "forwarded-untouched"
    return headers


def _money_headers(
    headers: dict[str, str],
    enabled: bool,
    segments: tuple[Segment, ...],
    tokens: tuple[int, ...],
    price: float | None,
) -> None:
    """Tokens saved (or that would be saved), and their input price when the model has one."""
    action = "clamped" if enabled else "would-clamp"
    saved = sum(n for s, n in zip(segments, tokens, strict=True) if s.action == action)
    name = "saved" if enabled else "would-save"
    headers[f"{HEADER_PREFIX}-{name}-tokens"] = str(saved)
    money = usd(saved, price)
    if money is not None:
        headers[f"{HEADER_PREFIX}-{name}-usd"] = f"{money:.6f}"


def _choice(request: Request, name: str, allowed: tuple[str, ...]) -> str | None:
    """A request header restricted to `allowed` values; 400 naming them otherwise."""
    header = f"{HEADER_PREFIX}-{name}"
    value = request.headers.get(header)
    if value is None:
        return None
    value = value.strip().lower()
    if value not in allowed:
        options = ", ".join(allowed[:-1]) + f" or {allowed[-1]}"
        raise BadRequest(f"header {header} must be {options}, got {value!r}", param=header)
    return value


def _bearer(value: str | None) -> str | None:
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _basic_password(value: str | None) -> str | None:
    scheme, _, encoded = (value or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None
    password = decoded.partition(":")[2]
    return password or None


def _enabled(request: Request, settings: Settings) -> bool:
    value = request.headers.get(HEADER_PREFIX)
    if value is None:
        return settings.enabled
    value = value.strip().lower()
    if value in ("on", "true", "1"):
        return True
    if value in ("off", "false", "0"):
        return False
    raise BadRequest(
        f"header {HEADER_PREFIX} must be 'on' or 'off', got {value!r}", param=HEADER_PREFIX
    )


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(
            f"request body is {int(declared):,} bytes, over proxy.maxBodyBytes ({limit:,}); "
            "raise proxy.maxBodyBytes or send less context"
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(
                f"request body is over proxy.maxBodyBytes ({limit:,} bytes); "
                "raise proxy.maxBodyBytes or send less context"
            )
        chunks.append(chunk)
    return b"".join(chunks)


async def _error_response(request: Request, exc: Exception) -> Response:
    if isinstance(exc, CtxBudgetError):
        headers = getattr(exc, "headers", None) or {}
        return JSONResponse(exc.to_dict(), status_code=exc.status, headers=headers)
    if isinstance(exc, HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = {
            404: f"no route {request.url.path}: ctxbudget serves /v1/chat/completions, "
            "/v1/models, /v1/memories, /context/budget and /healthz",
            405: f"{request.method} is not allowed on {request.url.path}",
        }.get(exc.status_code, str(exc.detail))
        body = {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": code,
            }
        }
        return JSONResponse(body, status_code=exc.status_code)
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    body = {
        "error": {
            "message": f"internal error in ctxbudget: {exc.__class__.__name__}",
            "type": "server_error",
            "param": None,
            "code": "internal_error",
        }
    }
    return JSONResponse(body, status_code=500)


def create_app(
    config: ConfigSource,
    *,
    upstream: Upstream | None = None,
    reports: ReportStore | None = None,
    env: Mapping[str, str] | None = None,
    run: str | None = None,
    clamp: Clamp = clamp_request,
    telemetry: Telemetry | None = None,
) -> Starlette:
    """The proxy app. Dependencies are injected; defaults are built from `config`.

    Telemetry, when not given, comes from `config` and the OTEL_* environment (or is off).
    """
    env = os.environ if env is None else env
    cfg = config.get()
    owns_telemetry = telemetry is None
    if telemetry is None:
        telemetry = Telemetry.from_config(cfg.telemetry, env)
    owns_reports = reports is None
    if reports is None:
        reports = ReportStore(
            cfg.report.path,
            run=run or env.get("CTXBUDGET_RUN_ID") or secrets.token_hex(6),
            telemetry=telemetry,
        )
    elif telemetry is not None:
        reports.telemetry = telemetry
    upstream = upstream or Upstream()
    proxy = Proxy(config, upstream=upstream, reports=reports, env=env, clamp=clamp)
    memories = proxy.memories

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await upstream.start()
        settings = proxy.settings()
        if settings.routes or settings.config.memory.rewrite is not None:
            from proxy.providers import preload_litellm

            preload_litellm()
        try:
            yield
        finally:
            await upstream.close()
            memories.close()
            if owns_reports:
                reports.close()
            else:
                reports.flush()
            if telemetry is not None and owns_telemetry:
                telemetry.shutdown()

    routes = [
        Route("/v1/chat/completions", proxy.chat_completions, methods=["POST"]),
        Route("/chat/completions", proxy.chat_completions, methods=["POST"]),
        Route("/v1/models", proxy.models, methods=["GET"]),
        Route("/context/budget", proxy.budget, methods=["GET"]),
        Route("/context/budget/requests/{id}", proxy.budget_request, methods=["GET"]),
        Route("/healthz", proxy.healthz, methods=["GET"]),
        Route("/v1/memories", memories.add, methods=["POST"]),
        Route("/v1/memories", memories.list, methods=["GET"]),
        Route("/v1/memories/{id}", memories.remove, methods=["DELETE"]),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            CtxBudgetError: _error_response,
            HTTPException: _error_response,
            Exception: _error_response,
        },
    )
    app.state.proxy = proxy
    return app
