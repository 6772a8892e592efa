"""Slow clients against the real server (issue 35, item 7): headers or a body sent a byte at a
time are cut off with a 408 in the route's wire format, an idle connection is closed, a peer's
connections past `proxy.limits.maxConnectionsPerClient` get a 503 while everyone else is
served, and none of it touches a legitimate large body, a slow-but-steady upload or a long
SSE stream. Small limits here; the defaults are in `proxy/config/schema.py`."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.server import ProxyServer, serve, standin_config
from tests.standin import StandIn

LIMITS = {
    "headerTimeoutSeconds": 1,
    "bodyTimeoutSeconds": 1,
    "bodyMinBytesPerSecond": 1000,
    "keepAliveTimeoutSeconds": 1,
    "maxConnectionsPerClient": 3,
}
ASK = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def proxy(
    tmp_path_factory: pytest.TempPathFactory, standin_server: StandIn
) -> Iterator[ProxyServer]:
    tmp = tmp_path_factory.mktemp("slow")
    config = standin_config(tmp, standin_server)
    config["proxy"]["limits"] = LIMITS
    with serve(tmp, config) as server:
        yield server


def _connect(server: ProxyServer, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(
        ("127.0.0.1", server.port), timeout=5, source_address=(source, 0)
    )


def _until_closed(
    sock: socket.socket, *, within: float, trickle: bytes = b""
) -> tuple[bytes, float]:
    """What the server sends until it closes the connection, and when it closed it (seconds
    from now); meanwhile `trickle` goes out a byte every 0.1 s."""
    start = time.monotonic()
    got = b""
    sock.settimeout(0.1)
    sent = 0
    while time.monotonic() - start < within:
        if sent < len(trickle):
            try:
                sock.sendall(trickle[sent : sent + 1])
            except OSError:
                pass
            sent += 1
        try:
            piece = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            break
        if not piece:
            break
        got += piece
    else:
        raise AssertionError(f"still open after {within} s (got {got[:200]!r})")
    return got, time.monotonic() - start


def _response(raw: bytes) -> tuple[int, dict[str, str], Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_headers_sent_a_byte_at_a_time_are_cut_off_with_a_408(
    proxy: ProxyServer, path: str
) -> None:
    with _connect(proxy) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\n".encode())
        raw, took = _until_closed(
            sock, within=6, trickle=b"Host: localhost\r\nX-Slow: " + b"a" * 100
        )
    status, headers, body = _response(raw)
    assert status == 408 and headers["connection"] == "close"
    assert 0.9 < took < 3, took
    message = "the request's headers did not arrive within 1 s (proxy.limits.headerTimeoutSeconds)"
    if path == "/v1/messages":  # Anthropic's shape, so its SDK raises its own error
        assert body["type"] == "error" and body["error"]["type"] == "timeout_error"
        assert body["error"]["message"].startswith(message)
    else:
        assert body["error"]["code"] == "request_timeout"
        assert body["error"]["message"].startswith(message)


def test_an_idle_connection_is_closed_new_or_after_a_response(proxy: ProxyServer) -> None:
    with _connect(proxy) as sock:
        raw, took = _until_closed(sock, within=5)
    assert raw == b"" and 0.9 < took < 3, took  # closed quietly, as uvicorn closes idle ones
    with _connect(proxy) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        raw, took = _until_closed(sock, within=5)
    assert raw.startswith(b"HTTP/1.1 200") and took < 3, took


def test_a_trickled_body_is_cut_off_with_a_408(proxy: ProxyServer) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
        b"content-type: application/json\r\ncontent-length: 100000\r\n\r\n"
    )
    with _connect(proxy) as sock:
        sock.sendall(head)
        raw, took = _until_closed(sock, within=6, trickle=b'{"model": "' + b"a" * 100)
    status, _, body = _response(raw)
    assert status == 408 and body["error"]["code"] == "request_timeout"
    assert "the request body arrived too slowly" in body["error"]["message"]
    assert "proxy.limits.bodyTimeoutSeconds" in body["error"]["message"]
    assert 0.9 < took < 3, took
    assert httpx.get(f"{proxy.root}/healthz", timeout=5).status_code == 200


def test_a_large_body_and_a_slow_steady_upload_are_not_cut(
    proxy: ProxyServer, standin: StandIn
) -> None:
    text = "A paragraph of a long pasted log, with words. " * 520_000  # 24 MB
    big = {"model": "gpt-4o", "messages": [{"role": "user", "content": text}]}
    r = httpx.post(f"{proxy.base_url}/chat/completions", json=big, timeout=120)
    assert r.status_code == 200, r.text[:300]

    def steady() -> Iterator[bytes]:
        # 2 KB every 0.1 s for 3 s: 20 KB/s, three times the body timeout without finishing
        yield b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "'
        for _ in range(30):
            time.sleep(0.1)
            yield b"b" * 2048
        yield b'"}]}'

    start = time.monotonic()
    r = httpx.post(
        f"{proxy.base_url}/chat/completions",
        content=steady(),
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 200, r.text[:300]
    assert time.monotonic() - start > 3
    assert len(standin.last_json["messages"][0]["content"]) == 30 * 2048


def _stream(server: ProxyServer, source: str) -> socket.socket:
    """A connection from `source` holding an endless SSE stream, its first bytes read."""
    ask = {**ASK, "stream": True, "x_standin": {"endless": True}}
    body = json.dumps(ask).encode()
    sock = _connect(server, source)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\ncontent-type: "
        b"application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    )
    assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    return sock


def test_connections_past_the_cap_get_a_503_while_others_are_served(proxy: ProxyServer) -> None:
    streams = [_stream(proxy, "127.0.0.2") for _ in range(3)]
    try:
        with _connect(proxy, "127.0.0.2") as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            raw, took = _until_closed(sock, within=3)
        status, headers, body = _response(raw)
        assert status == 503 and headers["retry-after"] == "1" and took < 1, took
        assert body["error"]["code"] == "too_many_connections"
        assert body["error"]["message"].startswith(
            "too many connections from 127.0.0.2: at most 3 at once "
            "(proxy.limits.maxConnectionsPerClient)"
        )
        # another peer is served, and so is this one once a connection of its own is done
        assert httpx.get(f"{proxy.root}/healthz", timeout=5).status_code == 200
        assert httpx.post(f"{proxy.base_url}/chat/completions", json=ASK, timeout=30).is_success
        time.sleep(2)  # past every timeout: the streams go on
        for sock in streams:
            sock.settimeout(2)
            assert b"data: " in sock.recv(65536)
        streams.pop().close()
        time.sleep(0.3)
        with _connect(proxy, "127.0.0.2") as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            raw, _ = _until_closed(sock, within=3)
        assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
    finally:
        for sock in streams:
            sock.close()


def test_a_stream_longer_than_every_timeout_is_not_cut(proxy: ProxyServer) -> None:
    ask = {**ASK, "stream": True, "x_standin": {"chunks": 6, "chunk_delay": 0.5}}
    start = time.monotonic()
    with httpx.stream("POST", f"{proxy.base_url}/chat/completions", json=ask, timeout=30) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert time.monotonic() - start > 2.5
    assert lines[-1] == "data: [DONE]"
