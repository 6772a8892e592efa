"""litellm routes: their answers as `UpstreamReply`, their errors as the client sees them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from ctxbudget.proxy.config.schema import RouteConfig
from ctxbudget.proxy.errors import UpstreamError
from ctxbudget.proxy.upstream.litellm import LitellmReply, _upstream_error

ROUTE = RouteConfig(model="anthropic/claude-x")


class _Model:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def model_dump(self, *, exclude_none: bool) -> dict[str, Any]:
        return {k: v for k, v in self.data.items() if not (exclude_none and v is None)}


class _Stream:
    def __init__(self, chunks: list[dict[str, Any]], fail: Exception | None = None) -> None:
        self.chunks, self.fail = chunks, fail

    async def __aiter__(self) -> AsyncIterator[_Model]:
        for chunk in self.chunks:
            yield _Model(chunk)
        if self.fail is not None:
            raise self.fail


class RateLimitError(Exception):
    status_code = 429

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.response = type("R", (), {"headers": {"retry-after": "3"}})()


class APIConnectionError(Exception):
    pass


class Timeout(Exception):
    pass


def test_a_json_answer_is_openai_json_without_nulls() -> None:
    reply = LitellmReply(_Model({"id": "x", "system_fingerprint": None}), ROUTE, stream=False)
    assert reply.status == 200
    assert reply.headers == {"content-type": "application/json"}
    assert orjson.loads(asyncio.run(reply.read())) == {"id": "x"}


def test_a_stream_is_openai_sse_ending_in_done() -> None:
    reply = LitellmReply(_Stream([{"id": "a"}, {"id": "b"}]), ROUTE, stream=True)

    async def collect() -> list[bytes]:
        return [c async for c in reply.iter_chunks()]

    assert asyncio.run(collect()) == [
        b'data: {"id":"a"}\n\n',
        b'data: {"id":"b"}\n\n',
        b"data: [DONE]\n\n",
    ]


def test_a_stream_that_fails_raises_the_upstream_error_it_maps_to() -> None:
    reply = LitellmReply(_Stream([{"id": "a"}], RateLimitError("too many")), ROUTE, stream=True)

    async def collect() -> list[bytes]:
        return [c async for c in reply.iter_chunks()]

    with pytest.raises(UpstreamError) as caught:
        asyncio.run(collect())
    assert caught.value.status == 429


@pytest.mark.parametrize(
    ("error", "status", "code", "message"),
    [
        (
            RateLimitError("too many\nTraceback: ..."),
            429,
            "upstream_error",
            "anthropic/claude-x returned HTTP 429: too many",
        ),
        (
            APIConnectionError("refused"),
            502,
            "upstream_unreachable",
            "anthropic/claude-x is unreachable or failed: APIConnectionError: refused",
        ),
        (
            Timeout("slow"),
            504,
            "upstream_timeout",
            "anthropic/claude-x did not answer in time: slow",
        ),
    ],
)
def test_litellm_errors_become_one_line_upstream_errors(
    error: Exception, status: int, code: str, message: str
) -> None:
    mapped = _upstream_error(error, ROUTE)
    assert (mapped.status, mapped.code, mapped.message) == (status, code, message)
    if status == 429:
        assert mapped.headers == {"retry-after": "3"}


def test_a_json_answer_read_as_chunks_is_the_one_object() -> None:
    reply = LitellmReply(_Model({"id": "x"}), ROUTE, stream=False)

    async def collect() -> list[bytes]:
        return [c async for c in reply.iter_chunks()]

    assert asyncio.run(collect()) == [b'{"id":"x"}']


def test_a_litellm_error_naming_the_routes_api_base_hides_its_secrets(
    caplog: pytest.LogCaptureFixture,
) -> None:
    base = "https://me:Z9pw@gw.example/v1?key=Z9key"
    route = RouteConfig(model="openai/gpt-x", api_base=base)
    mapped = _upstream_error(APIConnectionError(f"Cannot connect to {base}/chat"), route)
    assert mapped.message == (
        "openai/gpt-x is unreachable or failed: APIConnectionError: "
        "Cannot connect to https://***@gw.example/v1?key=***/chat"
    )
    assert "openai/gpt-x failed: Cannot connect to https://***@gw.example" in caplog.text
    assert "Z9" not in caplog.text
