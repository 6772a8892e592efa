"""The request pipeline: one path for every wire format, in stages that each own their cleanup.

    handle ─► _receive   authenticate, read, parse (here, or a large body in the offload
              │          process), the litellm route
              ├► _answer_command   the chat command, answered here: nothing goes upstream
              ├► _prepare   clamp ─► _recall (session, memory placed again or recalled)
              │             ─► headers ─► the record's draft (`Recorder`)
              └► _send      forward ─► _forward (retried without `stream_options` when the
                            upstream refuses it) ─► relay (SSE) or read whole; a client that
                            leaves cancels the upstream request

What differs between formats is behind `WireFormat`/`WireRequest` (`proxy/wire/`); where a
request's work runs (here, or a large body's in the offload worker) is behind its `Work`
(`proxy/pipeline/work.py`), which `Executor` chooses once: no stage asks which it holds. The
caps are pure functions reached through `caps.Clamp`; memory's front door is
`memory.recaller` (through `proxy/pipeline/recall.py`, off the event loop); the upstream is
an `UpstreamClient`, or litellm for a model in `proxy.routes`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import secrets
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ctxbudget.caps import Segment
from ctxbudget.caps.types import evolve
from ctxbudget.memory.query import UserTurn
from ctxbudget.memory.recaller import RecallReport
from ctxbudget.proxy.access.auth import owner_for
from ctxbudget.proxy.cache.blocks import Block
from ctxbudget.proxy.cache.mirrors import MirrorView
from ctxbudget.proxy.cache.prefix import ClientPrefix
from ctxbudget.proxy.cache.resent import RESENT, ChangedInPlace
from ctxbudget.proxy.cache.sessions import PrefixChange, session_key
from ctxbudget.proxy.config.schema import RouteConfig
from ctxbudget.proxy.config.settings import Settings
from ctxbudget.proxy.errors import BadRequest, ClampError, CtxBudgetError, UpstreamError
from ctxbudget.proxy.pipeline.chat_command import CommandMode, find_command, full_section
from ctxbudget.proxy.pipeline.disconnect import DisconnectWatch
from ctxbudget.proxy.pipeline.executor import Executor
from ctxbudget.proxy.pipeline.headers import (
    PREFIX,
    RequestOptions,
    budget_headers,
    money_headers,
    net_header,
)
from ctxbudget.proxy.pipeline.holdout import ARM_HEADER, Drawn, HoldoutStage, mark
from ctxbudget.proxy.pipeline.marks import timed
from ctxbudget.proxy.pipeline.offload import Offload
from ctxbudget.proxy.pipeline.prune import Pruned, PruneStage
from ctxbudget.proxy.pipeline.recall import RecallStage, Skipped
from ctxbudget.proxy.pipeline.relay import CLIENT_GONE, Recorder, read_whole, relay
from ctxbudget.proxy.pipeline.summaries import Summarizer
from ctxbudget.proxy.pipeline.work import Work
from ctxbudget.proxy.report import RequestRecord
from ctxbudget.proxy.report.prices import input_price, prices
from ctxbudget.proxy.report.render import TEXT_SECTIONS, render_summary, render_text
from ctxbudget.proxy.report.usage import UsageChunkDropper, UsageReader
from ctxbudget.proxy.routes.report import Reporting
from ctxbudget.proxy.state import ProxyState
from ctxbudget.proxy.upstream.http import UpstreamReply
from ctxbudget.proxy.urls import redact
from ctxbudget.proxy.wire.body import read_body
from ctxbudget.proxy.wire.types import WireFormat, WireRequest

log = logging.getLogger("ctxbudget.proxy")
_IDS = random.Random(secrets.randbits(64))
"""Request ids: unique, not secret (a key reads only its own requests by id), and without a
system call per request (`secrets` reads the OS's random source every time)."""

Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass(kw_only=True)
class Call:
    """One request on its way through the stages."""

    request: Request
    headers: Mapping[str, str]
    """The request's headers, to look up (`_headers`)."""
    wire: WireFormat
    settings: Settings
    owner: str
    options: RequestOptions
    body: WireRequest
    work: Work
    """Where `body`'s work runs (here, or the offload worker): what it is asked beside the
    format (`proxy/pipeline/work.py`)."""
    turn: UserTurn | None
    route: RouteConfig | None
    """The litellm route of the request's model, if it has one."""
    started: float
    """`perf_counter()` when the request arrived."""
    marks: dict[str, int]
    """Wall-clock ns of each phase, for the telemetry spans."""
    now: float = 0.0
    """When the request came, by the app's clock (`ProxyState.clock`): pruning's time."""
    answered: Callable[[], None] | None = None
    """What to do once the upstream answered the request (pruning's summaries)."""
    drawn: Drawn | None = None
    """The request's arm, with a holdout configured (`proxy/pipeline/holdout.py`)."""
    id: str = field(default_factory=lambda: f"cb-{_IDS.getrandbits(64):016x}")


@dataclass(frozen=True)
class Outgoing:
    """What `_prepare` made for the request's answer: its headers and its record."""

    headers: dict[str, str]
    recorder: Recorder


class Pipeline:
    """Serves proxied requests of any wire format."""

    def __init__(
        self, state: ProxyState, reporting: Reporting, offload: Offload | None = None
    ) -> None:
        self.state = state
        self.reporting = reporting
        self.offload = offload or Offload()
        """The worker process for large bodies (started by the first one; the app closes it)."""
        self.executor = Executor(self.offload, state.clamp, state.conversations)
        self.recall = RecallStage(state.stores, state.tokens, state.env)
        self.prune = PruneStage(
            state.reports.ledger,
            state.sessions,
            Summarizer(state.reports, state.upstream, state.env, clock=state.clock),
            state.mirrors,
            memo=state.memo,
        )
        self.holdout = HoldoutStage(state.reports.arms)

    def endpoint(self, wire: WireFormat) -> Endpoint:
        """The Starlette endpoint serving `wire`'s route(s)."""

        async def serve(request: Request) -> Response:
            request.state.wire = wire  # errors are answered in the client's own format
            return await self.handle(request, wire)

        return serve

    async def handle(self, request: Request, wire: WireFormat) -> Response:
        call = await self._receive(request, wire)
        if call is None:
            return Response(status_code=CLIENT_GONE)
        mode = find_command(call.turn) if wire.generates else None
        if mode is not None:
            return await self._answer_command(call, mode)
        return await self._send(call, await self._prepare(call))

    # -- stages --------------------------------------------------------------------------

    async def _receive(self, request: Request, wire: WireFormat) -> Call | None:
        """Authenticate, read and parse; None when the client left while its large body
        waited for the offload process."""
        started = time.perf_counter()
        marks: dict[str, int] = {}
        with timed(marks, "start", "parsed"):
            settings = request_settings(request, self.state)
            headers = _headers(request)
            owner = owner_for(headers, settings)
            options = RequestOptions.from_headers(headers, default_enabled=settings.enabled)
            raw = await read_body(request, settings.max_body_bytes)
            # parsed and clamped here, or in the offload worker: the work runs where it
            # should (`Executor`), and nothing below asks where
            prepared = await self.executor.prepare(
                request, wire, raw, owner=owner, settings=settings, apply=options.enabled
            )
            if prepared is None:
                return None
            work, turn = prepared
            body = work.body
            wire.admit(body, owner)  # e.g. no continuing another key's Responses conversation
        route = settings.route_for(body.model)
        if route is not None and wire.name != "chat":
            raise BadRequest(
                f"model {body.model!r} is routed through litellm (proxy.routes), which "
                f"ctxbudget serves for chat completions only, not {wire.name}: send this "
                "model's requests to /v1/chat/completions, or remove its route"
            )
        return Call(
            now=self.state.clock(),
            request=request,
            headers=headers,
            wire=wire,
            settings=settings,
            owner=owner,
            options=options,
            body=body,
            work=work,
            turn=turn,
            route=route,
            started=started,
            marks=marks,
        )

    async def _prepare(self, call: Call) -> Outgoing:
        """Clamp, prune, recall and inject; the answer's headers and the record's draft."""
        segments, clamp_error, recall, pruned = await self._change(call)
        model = call.route.model if call.route else call.body.model
        encoding = call.settings.encoding_for(call.body.model)
        price = input_price(model)
        # ~0.1 ms per 1,000 chars the first time a text is seen, a cache hit on every later
        # turn that resends it (a large body's were counted in the offload process)
        saved = call.work.saved_tokens(segments, self.state.tokens, encoding, owner=call.owner)
        headers = budget_headers(
            call.id, call.options.enabled, segments, clamp_error, recorded=call.wire.generates
        )
        money_headers(headers, call.options.enabled, segments, saved, price)
        recall.headers(headers)
        if pruned is not None and pruned.skipped is not None:
            headers[f"{PREFIX}-pruning-skipped"] = "database-unavailable"
        drawn = call.drawn
        if drawn is not None and not drawn.chosen:
            headers[ARM_HEADER] = drawn.arm
        draft = evolve(
            _DRAFT,
            id=call.id,
            ts=0.0,
            model=call.body.model,
            enabled=call.options.enabled,
            stream=call.body.stream,
            status=0,
            duration_ms=0.0,
            segments=segments,
            encoding=encoding,
            route=call.route.model if call.route else call.wire.provider,
            wire=call.wire.name,
            clamp_error=clamp_error,
            segment_tokens=saved,
            input_price=price,
            marks=call.marks,
            worker=os.getpid(),
            owner=call.owner,
            note=call.body.note,
            tools_inline=call.body.inline_tools(),
            prices=prices(model),
            prune_skipped=pruned.skipped if pruned is not None else None,
            holdout=mark(drawn, segments, call.turn) if drawn is not None else None,
            **recall.record_fields(),
        )
        recorder = Recorder(
            self.state.reports,
            draft,
            started=call.started,
            record=call.wire.generates,
            usage=UsageReader(call.wire.name) if call.wire.generates else None,
            tokens=self.state.tokens,
            clock=self.state.clock,
            answered=call.answered,
        )
        return Outgoing(headers, recorder)

    async def _change(
        self, call: Call
    ) -> tuple[tuple[Segment, ...], str | None, RecallOutcome, Pruned | None]:
        """Everything that changes the body, in order: the caps, pruning (what the clamp
        found prunable, applied as decided), then the session's memory blocks placed again
        where they were (the cached prefix holds) and recall, once per user turn. The
        session and conversation are known first, from what the client sent: the
        conversation's arm decides whether anything is clamped or pruned at all."""
        body = call.body
        prefix = session = None
        with timed(call.marks, end="clamped"):
            if call.wire.generates:
                # a large body's blocks come hashed (`Digested`)
                prefix = body.client_prefix(call.owner)
                session = session_key(call.headers, body.get, body.model, prefix)
                call.drawn = await self.holdout.draw(
                    call.settings, call.headers, call.owner, prefix, session, now=call.now
                )
                if call.drawn is not None and call.drawn.held_out:
                    # exactly as with the budget off: nothing clamped or pruned (memory stays)
                    call.options = replace(call.options, enabled=False)
                    call.work.as_sent()
            segments, clamp_error = self._clamp(call)
            segments, prunable = _split_prunable(segments)
        if prefix is None or session is None:  # token counting: no session, recall as usual
            with timed(call.marks, "recall_start", "recall_end"):
                recall = await self._recall_only(call)
            return segments, clamp_error, recall, None
        pruned = await self.prune.run(
            call.work,
            owner=call.owner,
            session=session,
            prefix=prefix,
            prunable=prunable,
            settings=call.settings,
            apply=call.options.enabled,
            now=call.now,
            provider="anthropic" if call.wire.provider == "anthropic" else "openai",
        )
        call.answered = pruned.summarise
        with timed(call.marks, "recall_start", "recall_end"):
            recall = await self._recall(call, prefix, session, pruned)
        return segments + pruned.segments, clamp_error, recall, pruned

    def _clamp(self, call: Call) -> tuple[tuple[Segment, ...], str | None]:
        """Segments found (clamped, kept, or would-clamp with the budget off) and any error.

        A clamp that raises forwards the request untouched (fail-open), unless
        `failClosed` is set and the budget is on.
        """
        settings, enabled = call.settings, call.options.enabled
        try:
            found = call.body.clamp(
                self.state.clamp,
                settings.caps_for(call.owner),  # what the clamps remember: per owner
                settings.tool_names,
                apply=enabled,
            )
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

    async def _recall_only(self, call: Call) -> RecallOutcome:
        """Recall for a request with no session (token counting)."""
        found = await self.recall.inject(
            call.body, call.turn, call.owner, call.settings, call.options
        )
        if isinstance(found, Skipped):
            return RecallOutcome(None, skipped=found)
        return RecallOutcome(found)

    async def _recall(
        self, call: Call, prefix: ClientPrefix, session: str, pruned: Pruned
    ) -> RecallOutcome:
        """The session's memory blocks placed again where they were, recall for a new user
        turn, and what the request did to the session's cached prefix."""
        body, owner, settings, options = call.body, call.owner, call.settings, call.options
        recall = self.recall
        sessions = self.state.sessions
        placed: dict[int, str] = {}
        if settings.recall.inject and options.memories:
            placed = sessions.placed_memory(owner, session, prefix)
        for at, text in placed.items():
            body.place_memory(at, text)
        turn_at = _block_of(prefix, call.turn)
        recalled = skipped = None
        reused = 0
        before: list[Block] = []
        if placed and turn_at is not None and max(placed) >= turn_at:
            reused = placed[max(placed)].count("\n")  # a line a memory, after the header
        else:
            before = body.blocks()
            found = await recall.inject(body, call.turn, owner, settings, options)
            skipped = found if isinstance(found, Skipped) else None
            recalled = None if isinstance(found, Skipped) else found
        await call.work.settle()  # what was placed, applied (a large body's in its worker)
        if recalled is not None:
            placed.update(call.work.memory_added(before))
        change = sessions.observe(
            owner,
            session,
            prefix,
            body.blocks(),
            memory=placed,
            now=call.now,
            warm=pruned.warm,
            pruned=pruned.blocks(prefix),
        )
        retention = body.get("prompt_cache_retention")
        mirror = self.state.mirrors.observe(
            owner,
            session,
            "anthropic" if call.wire.provider == "anthropic" else "openai",
            body.blocks(),
            now=call.now,
            model=body.model or "",
            retention=retention if isinstance(retention, str) else None,
        )
        return RecallOutcome(
            recalled, call.work.defer_count(change), tuple(placed.values()), reused, skipped, mirror
        )

    async def _send(self, call: Call, out: Outgoing) -> Response:
        """Forward, then relay the answer (SSE) or read it whole; an abandoned request must not
        keep the upstream generating tokens for nobody."""
        watcher = call.wire.watch_reply(call.body, call.owner)
        reply: UpstreamReply | None = None
        # the upstream phase starts with its disconnect watch; the record ends it (`end`)
        with timed(call.marks, "upstream_start"):
            watch = DisconnectWatch(call.request)
        try:
            reply, dropper = await self._forward(call, out)
            headers = {**reply.headers, **out.headers}
            if call.body.stream:
                # the relay closes the upstream itself if the client goes
                relayed = relay(reply, out.recorder, call.wire, watcher, dropper)
                return StreamingResponse(relayed, status_code=reply.status, headers=headers)
            data = await read_whole(reply, out.recorder, watcher)
        except asyncio.CancelledError:
            if not watch.fired():
                raise
            if reply is not None:
                reply.close()
            out.recorder.finish(CLIENT_GONE, upstream_error="client disconnected before the answer")
            return Response(status_code=CLIENT_GONE)
        finally:
            watch.stop()
        if not isinstance(data, bytes):  # too large to hold: passed through as it arrives
            return StreamingResponse(data, status_code=reply.status, headers=headers)
        net_header(headers, out.recorder.net_usd)
        return Response(data, status_code=reply.status, headers=headers)

    async def _forward(
        self, call: Call, out: Outgoing
    ) -> tuple[UpstreamReply, UsageChunkDropper | None]:
        """The upstream's reply, and the dropper that hides the usage chunk ctxbudget asked
        for. A chat stream carries usage only when asked: ask for it (litellm routes keep the
        client's own choice); an upstream that refuses `stream_options` (older
        OpenAI-compatible servers) gets the client's request as it was, and is not asked
        again. An error is recorded with the request's headers."""
        url = call.wire.upstream_url(call.settings, _path(call.request), "")
        asks = (
            call.settings.request_usage
            and call.route is None
            and url not in self.state.refuses_usage
            and call.work.ask_usage()
        )
        try:
            try:
                return await self._upstream(call), UsageChunkDropper() if asks else None
            except UpstreamError as exc:
                if not asks or not _refuses_usage(exc):
                    raise
                log.warning(
                    "%s refused stream_options; usage of its streams stays unknown", redact(url)
                )
                self.state.refuses_usage.add(url)
                call.work.forget_usage()
                return await self._upstream(call), None
        except CtxBudgetError as exc:  # the upstream's, or the offload's while encoding
            exc.headers = {**exc.headers, **out.headers}
            out.recorder.finish(exc.status, upstream_error=exc.message)
            raise

    async def _upstream(self, call: Call) -> UpstreamReply:
        body, settings = call.body, call.settings
        if call.route is not None:
            values = await call.work.litellm_values()
            if values is not None:
                from ctxbudget.proxy.upstream.litellm import litellm_reply

                return await litellm_reply(
                    values, call.route, stream=body.stream, env=self.state.env
                )
        return await self.state.upstream.request(
            "POST",
            call.wire.upstream_url(settings, _path(call.request), _query(call.request)),
            body=await call.work.upstream_body(),
            headers=call.wire.upstream_headers(call.request.headers, settings),
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.read_timeout,
        )

    async def _answer_command(self, call: Call, mode: CommandMode) -> Response:
        viewer = call.owner if call.settings.proxy_keys else None  # a key sees its own report
        report = await self.reporting.report(call.settings, call.request, owner=viewer)
        section = full_section(call.turn) if mode == "full" and call.turn else None
        if mode == "json":
            text = orjson.dumps(report, option=orjson.OPT_INDENT_2).decode()
        elif section is not None and section not in TEXT_SECTIONS:
            text = (
                f"ctxbudget: the report has no section {section!r}; ask for one of "
                + ", ".join(f"/context budget full {name}" for name in TEXT_SECTIONS)
                + ", or /context budget full for all of it\n"
            )
        else:
            text = render_text(report, section) if mode == "full" else render_summary(report)
        headers = budget_headers(call.id, call.settings.enabled, (), None, recorded=False)
        headers[f"{PREFIX}-command"] = "context-budget"
        reply = call.wire.command_reply(text, call.body, request_id=call.id)
        if isinstance(reply.body, bytes):
            return Response(reply.body, media_type=reply.media_type, headers=headers)
        return StreamingResponse(reply.body, media_type=reply.media_type, headers=headers)


_DRAFT = RequestRecord(
    id="",
    ts=0.0,
    model=None,
    enabled=False,
    stream=False,
    status=0,
    duration_ms=0.0,
    segments=(),
    encoding="",
)
"""What a request's record starts from (`evolve` fills a record's fields without the frozen
dataclass's `__init__`, ~7 µs for its 40 fields; `marks`, the one made per record, is given)."""


def request_settings(request: Request, state: ProxyState) -> Settings:
    """The settings the request is served with: as the door (`BrowserGuard`) read them."""
    found = request.scope.get("state", {}).get("settings")
    return found if isinstance(found, Settings) else state.settings()


def _refuses_usage(exc: UpstreamError) -> bool:
    """Whether the upstream's 400 was about the `stream_options` ctxbudget added."""
    return exc.status in (400, 422) and "stream_options" in orjson.dumps(exc.body or {}).decode()


@dataclass(frozen=True)
class RecallOutcome:
    """What the recall stage did."""

    recalled: RecallReport | None
    change: PrefixChange | None = None
    texts: tuple[str, ...] = ()
    """Every memory block in the request (new or placed again)."""
    reused: int = 0
    """Memories of this user turn placed again (recall already ran for the turn)."""
    skipped: Skipped | None = None
    """Why recall did not run (the memory database did not answer), or None."""
    mirror: MirrorView | None = None
    """What the session's cache mirror predicted for the request (both copies)."""

    def headers(self, headers: dict[str, str]) -> None:
        """Add the memory and session headers."""
        if self.recalled is not None:
            headers[f"{PREFIX}-memories"] = str(self.recalled.injected)
            headers[f"{PREFIX}-profile"] = self.recalled.applied
        elif self.reused:
            headers[f"{PREFIX}-memories"] = str(self.reused)
        if self.skipped is not None:
            headers[f"{PREFIX}-memories-skipped"] = self.skipped.header
        if self.change is not None:
            headers[f"{PREFIX}-session"] = self.change.session
            if self.change.bust is not None:
                headers[f"{PREFIX}-cache-bust"] = self.change.bust

    def record_fields(self) -> dict[str, Any]:
        """The `RequestRecord` fields this stage fills."""
        return {
            "memory": self.recalled.to_dict() if self.recalled is not None else None,
            "session": self.change.session if self.change else None,
            "prefix": self.change,
            "mirror": self.mirror,
            "memory_texts": self.texts,
            "memory_reused": self.reused,
            "memory_skipped": self.skipped.reason if self.skipped is not None else None,
        }


def _block_of(prefix: ClientPrefix | None, turn: UserTurn | None) -> int | None:
    """The prefix block holding the user turn."""
    if prefix is None or turn is None:
        return None
    label = f"[{turn.index}]"
    for at in range(turn.index, min(turn.index + 3, len(prefix.blocks))):
        if prefix.blocks[at].label.endswith(label):  # after the tools and system: found at once
            return at
    return next(
        (i for i, b in enumerate(prefix.blocks) if b.label.endswith(f"[{turn.index}]")), None
    )


def _headers(request: Request) -> dict[str, str]:
    """The request's headers by name, a name given twice its first value (as Starlette's
    `request.headers.get`): one pass, where each `get` walked them all and raised for a
    name not sent (~1 µs; a request looks up ~12, most not sent)."""
    raw: list[tuple[bytes, bytes]] = request.scope["headers"]
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in reversed(raw)}


def _path(request: Request) -> str:
    """`request.url.path` without building the URL (~6 µs a request: host header parsed,
    URL joined and split again)."""
    path: str = request.scope["path"]
    return path.replace("?", "%3F").replace("#", "%23").replace("\\", "%5C")


def _query(request: Request) -> str:
    """`request.url.query` without building the URL (a fragment is not part of it)."""
    raw: bytes = request.scope.get("query_string", b"")
    return raw.decode(errors="replace").partition("#")[0]


def _split_prunable(
    segments: tuple[Segment, ...],
) -> tuple[tuple[Segment, ...], tuple[Segment, ...]]:
    """The clamp's segments, and apart the results pruning could take (action `prunable`).
    The clamp reports those last (`caps.resume.segments`, the whole pass alike), so where they
    start is found by halving (a long conversation's ~150 segments were read twice a
    request); the test suite (`CTXBUDGET_CHECK_RESENT=1`) checks it against reading them."""
    at = bisect_left(segments, True, key=_is_prunable)
    found = segments[:at], segments[at:]
    if RESENT.check:
        whole = (
            tuple(s for s in segments if s.action != "prunable"),
            tuple(s for s in segments if s.action == "prunable"),
        )
        if whole != found:
            raise ChangedInPlace("the clamp's prunable segments are not its last ones")
    return found


def _is_prunable(segment: Segment) -> bool:
    return segment.action == "prunable"


def _would(segment: Segment) -> Segment:
    return evolve(segment, action="would-clamp") if segment.action == "clamped" else segment
