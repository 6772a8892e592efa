"""Where a request's work runs: here, or in the offload worker process — decided once, here.

The pipeline hands the body to `Executor.prepare` and gets back a `Work`
(`proxy/pipeline/work.py`) it uses the same way wherever it runs. A body with little left to
read (`Offload.takes`) is parsed and clamped in this process (`Here`); a large one goes to
the worker (`Offload.prepare`: an `OffloadedRequest`), which may make it wait behind other
large bodies, so a client that leaves meanwhile is noticed here and costs no job.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.requests import Request

from ctxbudget.caps import Clamp
from ctxbudget.memory.query import UserTurn
from ctxbudget.proxy.config.settings import Settings
from ctxbudget.proxy.pipeline.disconnect import DisconnectWatch
from ctxbudget.proxy.pipeline.offload import Offload
from ctxbudget.proxy.pipeline.work import Here, Work
from ctxbudget.proxy.wire.conversations import Conversations
from ctxbudget.proxy.wire.types import WireFormat

log = logging.getLogger("ctxbudget.proxy")


class Executor:
    """Runs each request's work where it should run (the one place that knows which)."""

    def __init__(
        self, offload: Offload, clamp: Clamp, conversations: Conversations | None = None
    ) -> None:
        self.offload = offload
        self.clamp = clamp
        """The app's clamp (`create_app`'s `clamp`), run wherever the work runs."""
        self.conversations = conversations
        """The app's conversations (`ProxyState.conversations`): what this process knows of
        each owner's last requests (the worker keeps its own)."""

    async def prepare(
        self,
        request: Request,
        wire: WireFormat,
        raw: bytes,
        *,
        owner: str,
        settings: Settings,
        apply: bool,
    ) -> tuple[Work, UserTurn | None] | None:
        """The body parsed (a large one clamped too) and its user turn; None when the client
        left while its large body waited for the offload process. Work that grows with the
        body runs in another process for a large one, so one 30 MB request does not stall
        every other client (a thread would not do: single C calls over its 30 MB string hold
        the GIL for tens of ms); small ones skip the hop."""
        conversations = self.conversations
        if not self.offload.takes(raw, owner, conversations):
            body = wire.parse(raw, owner=owner, conversations=conversations)
            return Here(body, conversations), body.user_turn()
        # it may wait behind other large bodies: a client that gives up meanwhile costs no
        # job (a job not yet started is dropped with the cancelled wait)
        early = DisconnectWatch(request)
        try:
            return await self.offload.prepare(
                wire, raw, owner=owner, clamp=self.clamp, settings=settings, apply=apply
            )
        except asyncio.CancelledError:
            if not early.fired():
                raise
            log.info("client disconnected while its large body waited to be parsed")
            return None
        finally:
            early.stop()
