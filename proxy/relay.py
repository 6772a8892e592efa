"""The end of the request path: relay the upstream's answer, and record the request once.

`Recorder` holds the request's draft report record and queues it, completed, exactly once:
when a JSON answer is read, when a stream ends (completed, broken upstream, or the client
gone), or when the upstream call fails. `relay` is the one SSE relay, for every upstream
(HTTP or litellm) and every wire format.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace

from proxy.errors import UpstreamError
from proxy.report import ReportStore, RequestRecord
from proxy.upstream import UpstreamReply
from proxy.wire.types import WireFormat

log = logging.getLogger("ctxbudget.proxy")

CLIENT_GONE = 499
"""Status recorded for a stream whose client went away (nginx's convention)."""


class Recorder:
    """Completes one request's record and queues it for the report, exactly once."""

    def __init__(
        self, reports: ReportStore, draft: RequestRecord, *, started: float, keep_usage: bool
    ) -> None:
        self._reports = reports
        self.draft = draft
        self._started = started
        self.keep_usage = keep_usage
        """Keep the upstream's usage-bearing bytes (a report sink reads them)."""
        self.tail: bytes | None = None
        self.done = False

    def finish(self, status: int, *, upstream_error: str | None = None) -> None:
        if self.done:
            return
        self.done = True
        self.draft.marks["end"] = time.time_ns()
        self._reports.add(
            replace(
                self.draft,
                ts=time.time(),
                status=status,
                duration_ms=(time.perf_counter() - self._started) * 1000,
                upstream_error=upstream_error,
                response_tail=self.tail,
            )
        )


async def read_whole(reply: UpstreamReply, recorder: Recorder) -> bytes:
    """A JSON answer, read whole; the record is finished either way."""
    try:
        data = await reply.read()
    except Exception as exc:
        recorder.finish(502, upstream_error=str(exc))
        raise UpstreamError(f"upstream connection broke while answering: {exc}") from exc
    if recorder.keep_usage:
        recorder.tail = data
    recorder.finish(reply.status)
    return data


async def relay(reply: UpstreamReply, recorder: Recorder, wire: WireFormat) -> AsyncIterator[bytes]:
    """Relay the upstream's SSE bytes as they arrive; close the upstream if the client goes."""
    completed = False
    failure: UpstreamError | None = None
    try:
        keep, marker = recorder.keep_usage, wire.usage_marker
        async for chunk in reply.iter_chunks():
            if keep and marker in chunk:
                recorder.tail = chunk
            yield chunk
        completed = True
    except Exception as exc:  # upstream broke mid-stream: the status line is already sent
        failure = (
            exc
            if isinstance(exc, UpstreamError)
            else UpstreamError(f"upstream stream broke: {exc.__class__.__name__}: {exc}")
        )
        log.warning("%s", failure.message)
        yield wire.stream_error(failure)
    finally:
        if completed:
            reply.release()
        else:
            reply.close()  # client gone or upstream broke: the connection is not reusable
        if completed:
            recorder.finish(reply.status)
        elif failure is not None:
            recorder.finish(failure.status, upstream_error=failure.message)
        else:
            recorder.finish(CLIENT_GONE, upstream_error="client disconnected")
