"""`GET /v1/models`: the upstream's model list, passed through.

Agents ask it at start-up (OpenClaw's model picker, the OpenAI SDK's `models.list()`), with
the same credential as their chat requests: the proxy key, when `proxy.keys` is set, is
checked here and never sent upstream (`upstream_headers` puts the upstream's own key there).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ctxbudget.proxy.access.auth import owner_for
from ctxbudget.proxy.state import ProxyState
from ctxbudget.proxy.wire.types import WireFormat


class ModelList:
    """The model list of one app's upstream."""

    def __init__(self, state: ProxyState, wire: WireFormat) -> None:
        self.state = state
        self.wire = wire
        """The format whose upstream and credential the list comes from (chat completions)."""

    async def models(self, request: Request) -> Response:
        settings = self.state.settings()
        owner_for(request.headers, settings)  # the same door as a chat request's
        reply = await self.state.upstream.request(
            "GET",
            settings.upstream_url("/models"),
            body=None,
            headers=self.wire.upstream_headers(request.headers, settings),
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.read_timeout,
        )
        return Response(await reply.read(), status_code=reply.status, headers=reply.headers)
