"""Provider routes that are not OpenAI-compatible, through litellm.

A model name listed in `proxy.routes` (e.g. `"claude" → "anthropic/claude-sonnet-4-5"`) is
sent through `litellm.acompletion`, which translates to the provider's own wire format and
back. The answer is an `UpstreamReply` like the HTTP upstream's — OpenAI JSON, or OpenAI SSE
ending in `data: [DONE]` — so the pipeline relays and records it the same way. litellm is
imported only here, and only when a route is configured: importing it costs ~5 s and ~165 MB.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import threading
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson

from ctxbudget.proxy.config.schema import RouteConfig
from ctxbudget.proxy.errors import UpstreamError
from ctxbudget.proxy.urls import redact

log = logging.getLogger("ctxbudget.providers")

# OpenAI request fields litellm maps for other providers; others are not sent to them.
_FORWARDED = (
    "temperature",
    "top_p",
    "n",
    "stop",
    "max_tokens",
    "max_completion_tokens",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "user",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "seed",
    "stream_options",
    "reasoning_effort",
    "metadata",
)

_import_lock = threading.Lock()


def import_litellm() -> Any:
    with _import_lock:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        return importlib.import_module("litellm")


def preload_litellm() -> None:
    """Import litellm on a background thread so the first routed request does not wait 5 s."""
    threading.Thread(target=_preload, name="ctxbudget-litellm-import", daemon=True).start()


def _preload() -> None:
    try:
        import_litellm()
    except Exception:  # the first routed request imports it again, and says what failed
        log.warning("preloading litellm failed; routed requests will try again", exc_info=True)


async def litellm_reply(
    body: dict[str, Any], route: RouteConfig, *, stream: bool, env: Mapping[str, str]
) -> LitellmReply:
    """Send OpenAI chat `body` through litellm on `route`; `UpstreamError` when it fails."""
    litellm = await asyncio.to_thread(import_litellm)
    kwargs: dict[str, Any] = {k: body[k] for k in _FORWARDED if k in body}
    api_key = env.get(route.api_key_env) if route.api_key_env else None
    try:
        response = await litellm.acompletion(
            model=route.model,
            messages=body["messages"],
            stream=stream,
            api_base=route.api_base,
            api_key=api_key,
            drop_params=True,
            # litellm 1.106.2 routes any request with `tools` through its MCP bridge, which
            # imports the optional `mcp` package; we never use litellm's MCP tools.
            _skip_mcp_handler=True,
            **kwargs,
        )
    except Exception as exc:
        raise _upstream_error(exc, route) from exc
    return LitellmReply(response, route, stream=stream)


class LitellmReply:
    """`UpstreamReply` of a litellm answer: OpenAI JSON, or OpenAI SSE events."""

    status = 200

    def __init__(self, response: Any, route: RouteConfig, *, stream: bool) -> None:
        self._response = response
        self._route = route
        self._stream = stream
        media = "text/event-stream" if stream else "application/json"
        self.headers = {"content-type": media}

    async def read(self) -> bytes:
        return orjson.dumps(self._response.model_dump(exclude_none=True))

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        if not self._stream:  # a JSON answer is one object
            yield await self.read()
            return
        try:
            async for chunk in self._response:
                yield b"data: " + orjson.dumps(chunk.model_dump(exclude_none=True)) + b"\n\n"
        except Exception as exc:
            raise _upstream_error(exc, self._route) from exc
        yield b"data: [DONE]\n\n"

    def close(self) -> None:
        """Nothing to close: litellm owns its connections."""

    def release(self) -> None:
        """Nothing to release: litellm owns its connections."""


def _first_line(exc: Exception, route: RouteConfig) -> str:
    """litellm puts tracebacks and bug-report links in its messages; clients get one line,
    without the route's `apiBase` secrets should it name it."""
    text = _hidden(str(getattr(exc, "message", None) or exc).strip(), route)
    line = text.splitlines()[0] if text else exc.__class__.__name__
    return line[:300]


def _hidden(text: str, route: RouteConfig) -> str:
    return text.replace(route.api_base, redact(route.api_base)) if route.api_base else text


def _upstream_error(exc: Exception, route: RouteConfig) -> UpstreamError:
    name = exc.__class__.__name__
    log.warning("%s failed: %s", route.model, _hidden(str(exc), route))
    status = getattr(exc, "status_code", None)
    if "Timeout" in name:
        return UpstreamError(
            f"{route.model} did not answer in time: {_first_line(exc, route)}",
            status=504,
            code="upstream_timeout",
        )
    if "APIConnectionError" in name or not isinstance(status, int) or status < 400:
        return UpstreamError(
            f"{route.model} is unreachable or failed: {name}: {_first_line(exc, route)}",
            status=502,
            code="upstream_unreachable",
        )
    headers = {}
    retry = getattr(getattr(exc, "response", None), "headers", {}).get("retry-after")
    if retry:
        headers["retry-after"] = retry
    return UpstreamError(
        f"{route.model} returned HTTP {status}: {_first_line(exc, route)}",
        status=status,
        code="upstream_error",
        headers=headers,
    )
