"""A client that leaves, noticed while its request waits (upstream, or for the offload worker)."""

from __future__ import annotations

import asyncio

from starlette.requests import Request


class DisconnectWatch:
    """Cancels the request's own task if the client disconnects while it waits upstream.

    One watcher task per request (cheaper than racing each await against one): the body is
    read, so the next thing the server can say is that the client went away.
    """

    def __init__(self, request: Request) -> None:
        self._task = asyncio.current_task()
        self._fired = False
        self._watcher: asyncio.Future[None] | None = asyncio.ensure_future(self._watch(request))

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
        if self._watcher is not None:
            self._watcher.cancel()
        # the cancelled watcher's error holds its frame, the frame this watch (and the
        # request, with its body): let go of the watcher, or the two make a cycle that only
        # the collector frees, each request's body held until it runs
        self._watcher = None
