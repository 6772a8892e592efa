"""The end of the request path: relay the upstream's answer, and record the request once.

`Recorder` holds the request's draft report record and queues it, completed, exactly once:
when a JSON answer is read, when a stream ends (completed, broken upstream, or the client
gone), or when the upstream call fails. `relay` is the one SSE relay, for every upstream
(HTTP or litellm) and every wire format.

A JSON answer is read whole before its headers go, so its record is priced here
(`Recorder.finish_priced`, `proxy/report/record.py` `billing`, off the event loop) and the
answer says what the request saved net (`x-context-budget-saved-usd`); the report's writer
keeps those same figures. A stream's headers leave before its usage: the report has its
net saving once the stream ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from ctxbudget.caps.types import evolve
from ctxbudget.proxy.errors import UpstreamError
from ctxbudget.proxy.report import ReportStore, RequestRecord
from ctxbudget.proxy.report.record import billing, billing_is_quick
from ctxbudget.proxy.report.usage import UsageChunkDropper, UsageReader
from ctxbudget.proxy.tokens import TokenCounter
from ctxbudget.proxy.upstream.http import UpstreamReply
from ctxbudget.proxy.wire.types import ReplyWatcher, WireFormat

log = logging.getLogger("ctxbudget.proxy")

CLIENT_GONE = 499
"""Status recorded for a stream whose client went away (nginx's convention)."""
FINAL_EVENTS = (
    b"\ndata: [DONE]",  # at a line's start: inside an event's JSON a newline is escaped
    b'"message_stop"',  # a quote inside JSON text is escaped: only the event's own type
    b'"response.completed"',
    b'"response.incomplete"',
    b'"response.failed"',
)
"""What ends an answer in each format (chat completions, Messages, Responses). A client that
closes the connection once it has one (Codex does, as soon as `response.completed` arrives)
got the whole answer: its request is recorded as completed, not as 499."""
_TAIL = max(map(len, FINAL_EVENTS)) - 1


class Recorder:
    """Completes one request's record and queues it for the report, exactly once."""

    def __init__(
        self,
        reports: ReportStore,
        draft: RequestRecord,
        *,
        started: float,
        record: bool = True,
        usage: UsageReader | None = None,
        tokens: TokenCounter | None = None,
        clock: Callable[[], float] = time.time,
        answered: Callable[[], None] | None = None,
    ) -> None:
        self._reports = reports
        self._answered = answered
        """Called once the request is finished with a 2xx status (its answer came whole)."""
        self._clock = clock
        """When the request finished (the app's clock: pruning reads the sessions' times)."""
        self._record = record
        """False for requests the report does not count (token counting)."""
        self.draft = draft
        self._started = started
        self.usage = usage
        """Reads the provider's usage from the reply (every relayed chunk, or the body)."""
        self._tokens = tokens
        """Counts the blocks ctxbudget moved, to price a JSON answer before it goes."""
        self.done = False
        self.net_usd: float | None = None
        """What the request saved net of cache effects (its cost without ctxbudget minus its
        cost), when `finish_priced` could price it; else None."""
        self._priced: asyncio.Future[dict[str, Any]] | None = None
        """A stream's `billing`, begun when its final event came (`settle`)."""

    def finish(self, status: int, *, upstream_error: str | None = None) -> None:
        if self.done:
            return
        self.done = True
        if not self._record:
            return
        record = self._completed(status, upstream_error)
        priced = self._priced
        if priced is None or upstream_error is not None:
            self._queue(record)
        elif priced.done():
            self._queue(_with_billing(record, priced))
        else:  # queued once its pricing (in a thread) is done, priced or not
            arrived = self._reports.add_later()

            def queue(done: asyncio.Future[dict[str, Any]]) -> None:
                try:
                    self._queue(_with_billing(record, done), arrived)
                finally:
                    arrived(None)  # (a no-op once queued)

            priced.add_done_callback(queue)

    def settle(self) -> None:
        """A stream's final event came (its usage is whole): price the request now, before
        the client has the last bytes, so its usage is settled into the session's cache mirror
        (the scale, what the provider holds, the measured bill the guard reads) before the
        client's next request is decided on. Pruning reads them: left to the report's writer
        thread, a `pays` decision hung on whether the writer had got there first, and two
        replays of one session could differ. In a thread when there is much to count: the
        session's next request waits for it (`SessionMirror.settling`)."""
        draft = self.draft
        if (
            not self._record
            or self._priced is not None
            or self.usage is None
            or self._tokens is None
            or draft.mirror is None
            or draft.prices is None
            or (draft.prefix is not None and draft.prefix.late is not None)
        ):
            return
        record = evolve(draft, usage=self.usage.result())
        if record.usage is None:
            return
        try:
            if not billing_is_quick(record, self._tokens):
                self._priced = asyncio.ensure_future(
                    asyncio.to_thread(billing, record, self._tokens)
                )
                draft.mirror.session.settling = self._priced
                return
            money = billing(record, self._tokens)
        except Exception:  # the writer prices it; the answer goes on
            log.exception("request %s: pricing its answer failed", record.id)
            return
        self._priced = asyncio.get_running_loop().create_future()
        self._priced.set_result(money)

    async def finish_priced(self, status: int) -> None:
        """`finish` for a JSON answer read whole: price it first (`billing`, in a thread when
        it has blocks ctxbudget moved to count), so its headers can carry `net_usd`
        and the report keeps the same figures. Not priced when the reply had no usage or
        the model no price; nor when a large block's token count (`PrefixChange.late`, in
        the offload process) is not done within `LATE_HEADER_SECONDS` of the reply (the
        writer prices it then, as for a stream)."""
        if self.done:
            return
        if not self._record:
            self.finish(status)
            return
        self.done = True
        record = self._completed(status, None)
        try:
            if (
                self._tokens is not None
                and record.usage is not None
                and record.prices is not None
                and await _counted(record)
            ):
                if billing_is_quick(record, self._tokens):
                    money = billing(record, self._tokens)
                else:
                    money = await asyncio.to_thread(billing, record, self._tokens)
                record = evolve(record, billed=money)
                self.net_usd = money["netSavedUsd"]
        finally:  # queued exactly once, priced or not, even if the client left meanwhile
            self._queue(record)

    def _completed(self, status: int, upstream_error: str | None) -> RequestRecord:
        self.draft.marks["end"] = time.time_ns()
        return evolve(
            self.draft,
            ts=self._clock(),
            status=status,
            duration_ms=(time.perf_counter() - self._started) * 1000,
            upstream_error=upstream_error,
            usage=self.usage.result() if self.usage is not None else None,
            response_id=self.usage.response_id if self.usage is not None else None,
            response_model=self.usage.response_model if self.usage is not None else None,
        )

    def _queue(
        self, record: RequestRecord, add: Callable[[RequestRecord], None] | None = None
    ) -> None:
        (add or self._reports.add)(record)
        if log.isEnabledFor(logging.INFO):
            log.info("%s", summary_line(record))
        if self._answered is not None and 200 <= record.status < 300:
            try:
                self._answered()
            except Exception:  # what follows an answer never costs the answer
                log.exception("request %s: what follows its answer failed", record.id)


def _with_billing(record: RequestRecord, priced: asyncio.Future[dict[str, Any]]) -> RequestRecord:
    """`record` with the money its stream's `settle` priced (the writer prices it if that
    failed)."""
    if priced.cancelled():
        return record
    if (failed := priced.exception()) is not None:
        log.error("request %s: pricing its answer failed: %r", record.id, failed)
        return record
    return evolve(record, billed=priced.result())


LATE_HEADER_SECONDS = 0.5
"""How long a JSON answer waits for its large blocks' token count (counted while the upstream
answered: ~50 ms per MB) to carry its net saving. A count still running after that (a body of
tens of MB) does not hold the answer: it goes without the header, and the report has it."""


async def _counted(record: RequestRecord) -> bool:
    """Whether the blocks `record` moved are counted (a large body's, within the wait)."""
    late = record.prefix.late if record.prefix is not None else None
    if late is None or late.done():
        return True
    try:
        await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(late)), LATE_HEADER_SECONDS)
    except Exception:  # not in time, or the count failed: the writer prices it
        return False
    return True


def summary_line(r: RequestRecord) -> str:
    """One log line per request: id, format, model, status, clamps, saved chars, time — never
    content. The model name is the client's: control characters are escaped."""
    model = _plain(r.model or "-")[:100]
    if r.tally is not None:  # its sums, carried: no walk over the segments
        clamped, would = r.tally.acted("clamped"), r.tally.acted("would-clamp")
        acted, chars = clamped[0] + would[0], clamped[1] + would[1]
    else:
        found = [s for s in r.segments if s.action in ("clamped", "would-clamp")]
        acted, chars = len(found), sum(s.saved for s in found)
    verb = "saved" if r.enabled else "would save"
    return (
        f"{r.id} {r.wire} {model} {r.status} {acted} "
        f"{'clamped' if r.enabled else 'would clamp'}, {verb} {chars} "
        f"chars, {r.duration_ms:.0f} ms"
        + (f" ({_plain(r.upstream_error)[:200]})" if r.upstream_error else "")
    )


def _plain(text: str) -> str:
    """`text` with control characters (and anything non-ASCII) escaped: one log line stays
    one line, whatever a client or upstream put in it."""
    return text.encode("unicode_escape").decode("ascii")


BUFFER_BYTES = 8 * 1024 * 1024
"""JSON answers up to this size are read whole; larger ones pass through chunk by chunk."""


async def read_whole(
    reply: UpstreamReply,
    recorder: Recorder,
    watcher: ReplyWatcher | None = None,
    *,
    limit: int = BUFFER_BYTES,
) -> bytes | AsyncIterator[bytes]:
    """A JSON answer: its bytes when they fit in `limit`, else the rest as it arrives (a
    200 MB reply must not cost 200 MB; `watcher` does not see it). The record is finished
    either way."""
    chunks: list[bytes] = []
    size = 0
    stream = reply.iter_chunks()
    try:
        async for chunk in stream:
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                return _pass_through(chunks, stream, reply, recorder)
    except Exception as exc:
        reply.close()
        recorder.finish(502, upstream_error=str(exc))
        raise UpstreamError(f"upstream connection broke while answering: {exc}") from exc
    reply.release()
    data = b"".join(chunks)
    if watcher is not None:
        watcher.feed(data)
        watcher.close()
    if recorder.usage is not None:
        recorder.usage.read_json(data)
    await recorder.finish_priced(reply.status)
    return data


async def _pass_through(
    head: list[bytes], rest: AsyncIterator[bytes], reply: UpstreamReply, recorder: Recorder
) -> AsyncIterator[bytes]:
    completed = False
    error: str | None = "client disconnected"
    try:
        for chunk in head:
            yield chunk
        head.clear()
        async for chunk in rest:
            yield chunk
        completed, error = True, None
    except Exception as exc:  # the status line is sent: the client sees a cut-off body
        error = f"upstream connection broke while answering: {exc}"
        log.warning("%s", error)
    finally:
        if completed:
            reply.release()
            recorder.finish(reply.status)
        else:
            reply.close()
            recorder.finish(
                CLIENT_GONE if error == "client disconnected" else 502, upstream_error=error
            )


async def relay(
    reply: UpstreamReply,
    recorder: Recorder,
    wire: WireFormat,
    watcher: ReplyWatcher | None = None,
    dropper: UsageChunkDropper | None = None,
) -> AsyncIterator[bytes]:
    """Relay the upstream's SSE bytes as they arrive (`watcher` and the recorder's usage
    reader read them too; `dropper` removes the usage chunk the client did not ask for);
    close the upstream if the client goes."""
    completed = False
    delivered = False
    """The client was sent the answer's final event (`FINAL_EVENTS`)."""
    tail = b""
    failure: UpstreamError | None = None
    usage = recorder.usage
    try:
        async for chunk in reply.iter_chunks():
            if usage is not None:
                usage.feed(chunk)
            if watcher is not None:
                watcher.feed(chunk)
            if dropper is not None:
                chunk = dropper.feed(chunk)
                if not chunk:
                    continue
            if not delivered:  # looked for across chunk boundaries
                seen = tail + chunk
                found = any(event in seen for event in FINAL_EVENTS)
                tail = seen[-_TAIL:]
                if found:  # the usage is whole: settled before the client has the end
                    recorder.settle()
                yield chunk
                delivered = found
                continue
            yield chunk
        completed = True
        if dropper is not None and (rest := dropper.close()):
            yield rest
    except Exception as exc:  # upstream broke mid-stream: the status line is already sent
        failure = (
            exc
            if isinstance(exc, UpstreamError)
            else UpstreamError(f"upstream stream broke: {exc.__class__.__name__}: {exc}")
        )
        log.warning("%s", failure.message)
        if dropper is not None and (rest := dropper.close()):
            yield rest
        yield wire.stream_error(failure)
    finally:
        if watcher is not None:
            watcher.close()
        if completed:
            reply.release()
        else:
            reply.close()  # client gone or upstream broke: the connection is not reusable
        if completed or (delivered and failure is None):
            recorder.finish(reply.status)
        elif failure is not None:
            recorder.finish(failure.status, upstream_error=failure.message)
        else:
            recorder.finish(CLIENT_GONE, upstream_error="client disconnected")
