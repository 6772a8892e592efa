"""`HttpUpstream` against a small aiohttp server on loopback, and the header filters."""

from __future__ import annotations

import asyncio
import base64
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest
from aiohttp import web

from ctxbudget.proxy.errors import UpstreamError
from ctxbudget.proxy.upstream.http import (
    HttpUpstream,
    Parts,
    forward_request_headers,
    response_headers,
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _with_server(handler: Handler, body: Callable[[str], Awaitable[Any]]) -> Any:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        return await body(f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()


async def _send(
    upstream: HttpUpstream, url: str, *, read_timeout: float = 5.0, stream: bool = False
) -> tuple[int, dict[str, str], bytes | list[bytes]]:
    reply = await upstream.request(
        "POST",
        url,
        body=b'{"x": 1}',
        headers={"content-type": "application/json"},
        connect_timeout=2,
        read_timeout=read_timeout,
    )
    if stream:
        chunks = [c async for c in reply.iter_chunks()]
        reply.release()
        return reply.status, reply.headers, chunks
    return reply.status, reply.headers, await reply.read()


def _run(handler: Handler, **kwargs: Any) -> Any:
    async def go(base: str) -> Any:
        upstream = HttpUpstream()
        await upstream.start()
        try:
            return await _send(upstream, base + "/v1/chat/completions", **kwargs)
        finally:
            await upstream.close()

    return asyncio.run(_with_server(handler, go))


def test_a_json_answer_comes_back_as_sent_with_hop_by_hop_headers_dropped() -> None:
    async def handler(request: web.Request) -> web.Response:
        assert await request.read() == b'{"x": 1}'
        return web.Response(body=b'{"ok":true}', headers={"x-request-id": "r1", "keep-alive": "5"})

    status, headers, data = _run(handler)
    assert (status, data) == (200, b'{"ok":true}')
    lowered = {k.lower(): v for k, v in headers.items()}
    assert lowered["x-request-id"] == "r1"
    assert "keep-alive" not in lowered


def test_sse_arrives_chunk_by_chunk() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for i in range(3):
            await response.write(f"data: {i}\n\n".encode())
            await asyncio.sleep(0.02)
        await response.write_eof()
        return response

    status, _, chunks = _run(handler, stream=True)
    assert status == 200
    assert b"".join(chunks) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
    assert len(chunks) == 3  # not buffered into one


def test_an_openai_error_keeps_its_status_body_and_rate_limit_headers() -> None:
    body = {"error": {"message": "slow down", "type": "rate_limit", "param": None, "code": "rl"}}

    async def handler(request: web.Request) -> web.Response:
        return web.json_response(
            body, status=429, headers={"retry-after": "7", "x-ratelimit-remaining": "0"}
        )

    with pytest.raises(UpstreamError) as caught:
        _run(handler)
    error = caught.value
    assert (error.status, error.message) == (429, "slow down")
    assert {k.lower(): v for k, v in error.headers.items()} == {
        "retry-after": "7",
        "x-ratelimit-remaining": "0",
    }
    assert error.to_dict() == body


def test_a_non_json_error_is_named_with_its_url_status_and_text() -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=503, text="upstream overloaded")

    with pytest.raises(UpstreamError) as caught:
        _run(handler)
    assert caught.value.status == 503
    assert caught.value.message.endswith(
        "/v1/chat/completions returned HTTP 503: upstream overloaded"
    )
    assert caught.value.to_dict()["error"]["code"] == "upstream_error"


def test_a_slow_upstream_is_a_504_naming_the_setting() -> None:
    async def handler(request: web.Request) -> web.Response:
        # late: answers once the client has given up and closed the connection (at most 5 s;
        # a fixed 1 s sleep held the server's shutdown that long)
        for _ in range(500):
            if request.transport is None or request.transport.is_closing():
                break
            await asyncio.sleep(0.01)
        return web.Response(text="late")

    with pytest.raises(UpstreamError) as caught:
        _run(handler, read_timeout=0.1)
    assert caught.value.status == 504
    assert "(proxy.upstream.readTimeoutSeconds)" in caught.value.message


def _unreachable(url: str) -> tuple[UpstreamError, int]:
    """The error of sending to `url` (`{port}` filled in) where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once the socket closes

    async def go() -> Any:
        upstream = HttpUpstream()
        try:
            return await _send(upstream, url.format(port=port))
        finally:
            await upstream.close()

    with pytest.raises(UpstreamError) as caught:
        asyncio.run(go())
    return caught.value, port


def test_a_closed_port_is_a_502_unreachable() -> None:
    error, _ = _unreachable("http://127.0.0.1:{port}/v1/chat/completions")
    assert error.status == 502
    assert error.code == "upstream_unreachable"
    assert "is unreachable" in error.message


def test_a_connect_timeout_is_a_502_naming_the_connect_setting() -> None:
    """Was a 504 naming readTimeoutSeconds."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    queued = []
    for _ in range(8):  # fill the accept queue: the next connect waits, as a dead host does
        client = socket.socket()
        client.setblocking(False)
        try:
            client.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        queued.append(client)

    async def call() -> UpstreamError:
        upstream = HttpUpstream()
        try:
            await upstream.request(
                "POST",
                f"http://127.0.0.1:{port}/v1/chat/completions",
                body=b"{}",
                headers={},
                connect_timeout=0.3,
                read_timeout=30,
            )
        except UpstreamError as exc:
            return exc
        finally:
            await upstream.close()
        raise AssertionError("the request went through")

    try:
        error = asyncio.run(call())
    finally:
        for s in [*queued, server]:
            s.close()
    assert (error.status, error.code) == (502, "upstream_unreachable")
    assert "proxy.upstream.connectTimeoutSeconds" in error.message


def test_forwarded_headers_leave_out_hop_by_hop_auth_and_ours() -> None:
    given = {
        "Host": "proxy",
        "Connection": "keep-alive",
        "Content-Length": "10",
        "Authorization": "Bearer proxy-key",
        "X-Context-Budget": "on",
        "x-context-budget-agent": "main",
        "anthropic-version": "2023-06-01",
        "X-Custom": "1",
    }
    assert forward_request_headers(given, None) == {
        "anthropic-version": "2023-06-01",
        "X-Custom": "1",
    }
    assert forward_request_headers(given, "Bearer sk")["authorization"] == "Bearer sk"
    assert response_headers({"Transfer-Encoding": "chunked", "x-a": "b"}) == {"x-a": "b"}


def test_a_failure_never_shows_credentials_in_the_upstream_url() -> None:
    error, port = _unreachable("http://user:sk-secret9@127.0.0.1:{port}/v1/x")
    assert error.status == 502
    assert "sk-secret9" not in error.message
    assert f"http://***@127.0.0.1:{port}/v1/x" in error.message


def test_a_failure_never_shows_a_query_value_of_the_upstream_url() -> None:
    error, port = _unreachable("http://127.0.0.1:{port}/v1/x?token=tok-secret7")
    assert "tok-secret7" not in error.message
    assert f"http://127.0.0.1:{port}/v1/x?token=***" in error.message


def test_user_info_in_the_url_is_basic_auth_unless_the_request_has_authorization() -> None:
    """aiohttp refuses user info in the URL together with an Authorization header: every
    request with both was a 500 (issue 24, item 10)."""
    seen: list[tuple[str | None, str]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append((request.headers.get("authorization"), request.path_qs))
        return web.json_response({"ok": True})

    async def go(base: str) -> None:
        url = base.replace("http://", "http://me:p%40ss@") + "/v1/chat/completions?token=T"
        upstream = HttpUpstream()
        try:
            for headers in ({"Authorization": "Bearer sk-client"}, {}):
                reply = await upstream.request(
                    "POST",
                    url,
                    body=b"{}",
                    headers=headers,
                    connect_timeout=2,
                    read_timeout=5,
                )
                assert reply.status == 200
                await reply.read()
        finally:
            await upstream.close()

    asyncio.run(_with_server(handler, go))
    basic = "Basic " + base64.b64encode(b"me:p@ss").decode()
    assert seen == [
        ("Bearer sk-client", "/v1/chat/completions?token=T"),
        (basic, "/v1/chat/completions?token=T"),
    ]


def test_a_pooled_connection_the_server_closed_is_tried_again_on_a_fresh_one() -> None:
    """A keep-alive connection the server drops as the next request arrives (its idle time
    ran out): the request never reached it, and goes again on a new connection."""
    answer = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n"
        b"connection: keep-alive\r\n\r\n{}"
    )
    connections = []

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        served = 0
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            if served == 1 and len(connections) == 1:
                writer.close()  # the first connection dies with its second request
                return
            writer.write(answer)
            await writer.drain()
            served += 1

    async def run() -> list[int]:
        server = await asyncio.start_server(client, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        upstream = HttpUpstream()
        statuses = []
        try:
            for _ in range(3):
                reply = await upstream.request(
                    "POST",
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    body=b"{}",
                    headers={"content-type": "application/json"},
                    connect_timeout=2,
                    read_timeout=2,
                )
                await reply.read()
                statuses.append(reply.status)
        finally:
            await upstream.close()
            server.close()
        return statuses

    assert asyncio.run(run()) == [200, 200, 200]
    assert len(connections) == 2


def test_doctests() -> None:
    import doctest

    import ctxbudget.proxy.upstream.http

    assert doctest.testmod(ctxbudget.proxy.upstream.http).failed == 0


def test_a_body_in_parts_arrives_whole_with_its_length_not_chunked() -> None:
    """A conversation's body goes in pieces (views of the last one's, the new bytes): the
    upstream reads the bytes they join to, with a Content-Length."""
    big = bytes(range(256)) * 1024  # 256 KB: written as it is
    raw = msgspec.json.decode(b'["' + b"r" * 100_000 + b'"]', type=list[msgspec.Raw])[0]
    pieces = (b'{"a":', memoryview(big)[:200_000], b"", b",", memoryview(big)[5:70_000], b",", raw)
    pieces += (b"}",)
    seen: list[tuple[bytes, str | None, str | None]] = []

    async def handler(request: web.Request) -> web.Response:
        length = request.headers.get("content-length")
        seen.append((await request.read(), length, request.headers.get("transfer-encoding")))
        return web.Response(body=b"{}")

    async def go(base: str) -> None:
        upstream = HttpUpstream()
        try:
            for _ in range(2):  # the second on the pooled connection
                reply = await upstream.request(
                    "POST",
                    base + "/v1/chat/completions",
                    body=Parts(pieces),
                    headers={"content-type": "application/json"},
                    connect_timeout=2,
                    read_timeout=5,
                )
                assert await reply.read() == b"{}"
        finally:
            await upstream.close()

    asyncio.run(_with_server(handler, go))
    whole = b"".join(pieces)
    assert seen == [(whole, str(len(whole)), None)] * 2
