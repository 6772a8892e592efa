"""The request pipeline: one path for every wire format, read top to bottom in `handle`.

    authenticate → read and parse → (chat command?) → clamp → recall and inject
                 → forward → relay → record

What differs between formats is behind `WireFormat`/`WireRequest` (`proxy/wire/`); the caps
are pure functions reached through `caps.Clamp`; memory's front door is `memory.recaller`
(through `proxy/injection.py`, off the event loop); the upstream is an `UpstreamClient`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from caps import Segment
from memory.query import UserTurn
from memory.recaller import RecallReport
from proxy import command
from proxy.auth import owner_for
from proxy.body import read_body
from proxy.config import RouteConfig
from proxy.errors import BadRequest, ClampError, UpstreamError
from proxy.headers import PREFIX, RequestOptions, budget_headers, money_headers
from proxy.offload import Offload, OffloadedRequest, OffloadError
from proxy.price_map import input_price, prices
from proxy.relay import CLIENT_GONE, Recorder, read_whole, relay
from proxy.report import RequestRecord, segment_tokens_saved
from proxy.report.render import render_text
from proxy.reporting import Reporting
from proxy.sessions import ClientPrefix, PrefixChange, memory_added, session_key
from proxy.settings import Settings
from proxy.state import ProxyState
from proxy.upstream import UpstreamReply, redact
from proxy.usage import UsageChunkDropper, UsageReader
from proxy.wire.types import WireFormat, WireRequest

log = logging.getLogger("ctxbudget.proxy")

Endpoint = Callable[[Request], Awaitable[Response]]
_T = TypeVar("_T")


class Pipeline:
    """Serves proxied requests of any wire format."""

    def __init__(
        self, state: ProxyState, reporting: Reporting, offload: Offload | None = None
    ) -> None:
        self.state = state
        self.reporting = reporting
        self.offload = offload or Offload()
        """The worker process for large bodies (started by the first one; the app closes it)."""

    def endpoint(self, wire: WireFormat) -> Endpoint:
        """The Starlette endpoint serving `wire`'s route(s)."""

        async def serve(request: Request) -> Response:
            request.state.wire = wire  # errors are answered in the client's own format
            return await self.handle(request, wire)

        return serve

    async def handle(self, request: Request, wire: WireFormat) -> Response:
        started = time.perf_counter()
        marks = {"start": time.time_ns()}  # phase times for telemetry spans
        settings = self.state.settings()

        # authenticate, read and parse
        owner = owner_for(request.headers, settings)
        options = RequestOptions.from_headers(request.headers, default_enabled=settings.enabled)
        raw = await read_body(request, settings.max_body_bytes)
        # Work that grows with the body runs in another process for a large one, so one 30 MB
        # request does not stall every other client (a thread would not do: single C calls
        # over its 30 MB string hold the GIL for tens of ms); small ones skip the hop.
        large = self.offload.takes(raw)
        if large:
            # it may wait behind other large bodies: a client that gives up meanwhile costs
            # no job (a job not yet started is dropped with the cancelled wait)
            early = _DisconnectWatch(request)
            try:
                body, turn = await self.offload.prepare(
                    wire,
                    raw,
                    owner=owner,
                    clamp=self.state.clamp,
                    settings=settings,
                    apply=options.enabled,
                )
            except asyncio.CancelledError:
                if not early.fired():
                    raise
                log.info("client disconnected while its large body waited to be parsed")
                return Response(status_code=CLIENT_GONE)
            finally:
                early.stop()
        else:
            body, turn = _parse(wire, raw, owner)
        marks["parsed"] = time.time_ns()
        request_id = "cb-" + secrets.token_hex(8)
        route = settings.route_for(body.model)
        if route is not None and wire.name != "chat":
            raise BadRequest(
                f"model {body.model!r} is routed through litellm (proxy.routes), which "
                f"ctxbudget serves for chat completions only, not {wire.name}: send this "
                "model's requests to /v1/chat/completions, or remove its route"
            )

        mode = command.find_command(turn) if wire.generates else None
        if mode is not None:
            viewer = owner if settings.proxy_keys else None  # a key sees its own report
            return await self._answer_command(
                mode, wire, body, request_id, settings, request, viewer
            )

        # clamp (a large body was clamped in the offload process: this reads what it found)
        segments, clamp_error = self._clamp(body, settings, options.enabled)
        marks["clamped"] = marks["recall_start"] = time.time_ns()

        # recall and inject: memory blocks the session placed before go back where they were
        # (the cached prefix holds), and recall runs once per user turn
        memory = await self._memory(request, wire, body, turn, owner, settings, options)
        recalled = memory.recalled
        marks["recall_end"] = time.time_ns()

        # forward
        encoding = settings.encoding_for(body.model)
        price = input_price(route.model if route else body.model)
        # Counted here for the x-context-budget-saved-tokens header: ~0.1 ms per 1,000 chars
        # the first time a text is seen, a cache hit on every later turn that resends it.
        if isinstance(body, OffloadedRequest):
            seg_tokens = body.segment_tokens  # counted beside the clamp, in the worker process
        else:
            tokens = self.state.tokens
            seg_tokens = tuple(segment_tokens_saved(tokens, s, encoding) for s in segments)
        headers = budget_headers(request_id, options.enabled, segments, clamp_error)
        money_headers(headers, options.enabled, segments, seg_tokens, price)
        if recalled is not None:
            headers[f"{PREFIX}-memories"] = str(recalled.injected)
            headers[f"{PREFIX}-profile"] = recalled.applied
        elif memory.reused:
            headers[f"{PREFIX}-memories"] = str(memory.reused)
        if memory.change is not None:
            headers[f"{PREFIX}-session"] = memory.change.session
            if memory.change.bust is not None:
                headers[f"{PREFIX}-cache-bust"] = memory.change.bust
        recorder = Recorder(
            self.state.reports,
            RequestRecord(
                id=request_id,
                ts=0.0,
                model=body.model,
                enabled=options.enabled,
                stream=body.stream,
                status=0,
                duration_ms=0.0,
                segments=segments,
                encoding=encoding,
                route=route.model if route else wire.provider,
                wire=wire.name,
                clamp_error=clamp_error,
                segment_tokens=seg_tokens,
                input_price=price,
                marks=marks,
                memory=recalled.to_dict() if recalled is not None else None,
                worker=os.getpid(),
                owner=owner,
                note=body.note,
                session=memory.change.session if memory.change else None,
                prefix=memory.change,
                prices=prices(route.model if route else body.model),
                memory_texts=memory.texts,
                memory_reused=memory.reused,
            ),
            started=started,
            record=wire.generates,
            usage=UsageReader(wire.name) if wire.generates else None,
        )
        # A chat stream carries usage only when asked: ask for it, and hide the answer from
        # a client that did not (litellm routes keep the client's own choice).
        dropper = None
        upstream_url = wire.upstream_url(settings, request.url.path, "")
        if (
            settings.request_usage
            and route is None
            and upstream_url not in self.state.refuses_usage
            and body.ask_usage()
        ):
            dropper = UsageChunkDropper()
        watcher = wire.watch_reply(body, owner)
        marks["upstream_start"] = time.time_ns()
        reply: UpstreamReply | None = None
        # An abandoned request must not keep the upstream generating tokens for nobody.
        watch = _DisconnectWatch(request)
        try:
            try:
                try:
                    reply = await self._forward(request, wire, body, settings, route, large=large)
                except UpstreamError as exc:
                    if dropper is None or not _refuses_usage(exc):
                        raise
                    # An upstream that does not know stream_options (older OpenAI-compatible
                    # servers): send the client's request as it was, and stop asking this one.
                    log.warning(
                        "%s refused stream_options; usage of its streams stays unknown",
                        redact(upstream_url),
                    )
                    self.state.refuses_usage.add(upstream_url)
                    body.forget_usage()
                    dropper = None
                    reply = await self._forward(request, wire, body, settings, route, large=large)
            except (UpstreamError, OffloadError) as exc:  # the worker stopped while encoding
                exc.headers = {**exc.headers, **headers}
                recorder.finish(exc.status, upstream_error=exc.message)
                raise

            # relay and record (a stream's relay closes the upstream itself if the client goes)
            headers = {**reply.headers, **headers}
            if body.stream:
                return StreamingResponse(
                    relay(reply, recorder, wire, watcher, dropper),
                    status_code=reply.status,
                    headers=headers,
                )
            data = await read_whole(reply, recorder, watcher)
        except asyncio.CancelledError:
            if not watch.fired():
                raise
            if reply is not None:
                reply.close()
            recorder.finish(CLIENT_GONE, upstream_error="client disconnected before the answer")
            return Response(status_code=CLIENT_GONE)
        finally:
            watch.stop()
        if not isinstance(data, bytes):  # too large to hold: passed through as it arrives
            return StreamingResponse(data, status_code=reply.status, headers=headers)
        return Response(data, status_code=reply.status, headers=headers)

    # -- stages --------------------------------------------------------------------------

    async def _memory(
        self,
        request: Request,
        wire: WireFormat,
        body: WireRequest,
        turn: UserTurn | None,
        owner: str,
        settings: Settings,
        options: RequestOptions,
    ) -> _Memory:
        """The session's memory blocks placed again where they were, recall for a new user
        turn, and what the request did to the session's cached prefix."""
        if not wire.generates:  # token counting: no session, recall as for any request
            recalled = await self.state.memory.inject(body, turn, owner, settings, options)
            return _Memory(recalled=recalled)
        sessions = self.state.sessions
        # a large body's blocks come hashed from the offload process (`Digested`)
        prefix = ClientPrefix(body.blocks())
        session = session_key(request.headers, body.get, body.model, prefix)
        placed: dict[int, str] = {}
        if settings.recall.inject and options.memories:
            placed = sessions.placed_memory(owner, session, prefix)
        for at, text in placed.items():
            body.place_memory(at, text)
        turn_at = _block_of(prefix, turn)
        recalled = None
        reused = 0
        if placed and turn_at is not None and max(placed) >= turn_at:
            reused = placed[max(placed)].count("\n")  # a line a memory, after the header
        else:
            before = body.blocks()
            recalled = await self.state.memory.inject(body, turn, owner, settings, options)
            if recalled is not None and not isinstance(body, OffloadedRequest):
                placed.update(memory_added(before, body.blocks()))
        if isinstance(body, OffloadedRequest):
            await body.settle()  # the memory blocks placed in the worker, and hashed there
            if recalled is not None:
                placed.update(body.memory_added)
        change = sessions.observe(owner, session, prefix, body.blocks(), memory=placed)
        if isinstance(body, OffloadedRequest):
            change = body.defer_count(change)  # large moved blocks, counted after forwarding
        return _Memory(recalled, change, tuple(placed.values()), reused)

    def _clamp(
        self, body: WireRequest, settings: Settings, enabled: bool
    ) -> tuple[tuple[Segment, ...], str | None]:
        """Segments found (clamped, kept, or would-clamp with the budget off) and any error.

        A clamp that raises forwards the request untouched (fail-open), unless
        `failClosed` is set and the budget is on.
        """
        try:
            found = body.clamp(self.state.clamp, settings.caps, settings.tool_names, apply=enabled)
        except Exception as exc:  # a clamp bug must not lose the user's request
            message = f"{exc.__class__.__name__}: {exc}"
            refuse = settings.fail_closed and enabled
            log.exception(
                "clamp failed; %s",
                "refusing (failClosed)" if refuse else "forwarding the request untouched",
            )
            if refuse:
                raise ClampError(
                    f"clamping failed and agents.defaults.contextBudget.failClosed is true, so "
                    f"nothing was sent upstream: {message}"
                ) from exc
            return (), message
        if not enabled:
            found = [_would(s) for s in found]
        return tuple(found), None

    async def _forward(
        self,
        request: Request,
        wire: WireFormat,
        body: WireRequest,
        settings: Settings,
        route: RouteConfig | None,
        *,
        large: bool,
    ) -> UpstreamReply:
        litellm_body = (
            await _maybe_off_loop(large, body.litellm_body) if route is not None else None
        )
        if route is not None and litellm_body is not None:
            from proxy.providers import litellm_reply

            return await litellm_reply(litellm_body, route, stream=body.stream, env=self.state.env)
        return await self.state.upstream.request(
            "POST",
            wire.upstream_url(settings, request.url.path, request.url.query),
            body=await _maybe_off_loop(large, body.encode),
            headers=wire.upstream_headers(request.headers, settings),
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.read_timeout,
        )

    async def _answer_command(
        self,
        mode: command.CommandMode,
        wire: WireFormat,
        body: WireRequest,
        request_id: str,
        settings: Settings,
        request: Request,
        viewer: str | None,
    ) -> Response:
        report = await self.reporting.report(settings, request, owner=viewer)
        text = (
            orjson.dumps(report, option=orjson.OPT_INDENT_2).decode()
            if mode == "json"
            else render_text(report)
        )
        headers = budget_headers(request_id, settings.enabled, (), None)
        headers[f"{PREFIX}-command"] = "context-budget"
        reply = wire.command_reply(text, body, request_id=request_id)
        if isinstance(reply.body, bytes):
            return Response(reply.body, media_type=reply.media_type, headers=headers)
        return StreamingResponse(reply.body, media_type=reply.media_type, headers=headers)


def _refuses_usage(exc: UpstreamError) -> bool:
    """Whether the upstream's 400 was about the `stream_options` ctxbudget added."""
    return exc.status in (400, 422) and "stream_options" in orjson.dumps(exc.body or {}).decode()


@dataclass(frozen=True)
class _Memory:
    """What the memory stage did."""

    recalled: RecallReport | None
    change: PrefixChange | None = None
    texts: tuple[str, ...] = ()
    """Every memory block in the request (new or placed again)."""
    reused: int = 0
    """Memories of this user turn placed again (recall already ran for the turn)."""


def _block_of(prefix: ClientPrefix | None, turn: UserTurn | None) -> int | None:
    """The prefix block holding the user turn."""
    if prefix is None or turn is None:
        return None
    return next(
        (i for i, b in enumerate(prefix.blocks) if b.label.endswith(f"[{turn.index}]")), None
    )


def _parse(wire: WireFormat, raw: bytes, owner: str) -> tuple[WireRequest, UserTurn | None]:
    body = wire.parse(raw, owner=owner)
    return body, body.user_turn()


async def _maybe_off_loop(large: bool, work: Callable[..., _T], *args: Any) -> _T:
    """`work(*args)`, in a worker thread when `large` (an offloaded body's `encode` waits on
    the worker process)."""
    return await asyncio.to_thread(work, *args) if large else work(*args)


class _DisconnectWatch:
    """Cancels the request's own task if the client disconnects while it waits upstream.

    One watcher task per request (cheaper than racing each await against one): the body is
    read, so the next thing the server can say is that the client went away.
    """

    def __init__(self, request: Request) -> None:
        self._task = asyncio.current_task()
        self._fired = False
        self._watcher = asyncio.ensure_future(self._watch(request))

    async def _watch(self, request: Request) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        if self._task is not None:
            self._fired = True
            self._task.cancel()

    def fired(self) -> bool:
        """Whether the watcher cancelled the task (then the cancellation is consumed)."""
        if self._fired and self._task is not None:
            self._task.uncancel()
        return self._fired

    def stop(self) -> None:
        self._watcher.cancel()


def _would(segment: Segment) -> Segment:
    return replace(segment, action="would-clamp") if segment.action == "clamped" else segment
