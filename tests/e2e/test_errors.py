"""Bad input and failing upstreams: OpenAI-shaped errors, nothing half-forwarded."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.e2e.server import base_config, sdk, serve, standin_config, tracked
from tests.standin import StandIn


def _post(url: str, content: bytes, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{url}/chat/completions",
        content=content,
        headers={"content-type": "application/json", **headers},
        timeout=30,
    )


def _error(r: httpx.Response) -> dict[str, object]:
    body = r.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    error: dict[str, object] = body["error"]
    return error


@pytest.fixture
def server_url(tmp_path: Path, standin: StandIn):  # type: ignore[no-untyped-def]
    config = base_config(tmp_path, standin.base_url)
    config["proxy"]["maxBodyBytes"] = 4096
    with serve(tmp_path, config) as server:
        yield server.base_url


@pytest.mark.parametrize(
    ("body", "status", "param", "message"),
    [
        (b'{"model": "m", "messages": [', 400, None, "request body is not valid JSON"),
        (b"", 400, None, "request body is empty"),
        (b"[1, 2]", 400, None, "request body must be a JSON object, got list"),
        (b'{"model": "m"}', 400, "messages", "'messages' is required"),
        (b'{"model": "m", "messages": "hi"}', 400, "messages", "'messages' must be a list"),
        (b'{"model": 5, "messages": []}', 400, "model", "'model' must be a string, got int"),
        (
            b'{"model": "m", "messages": ["' + b"x" * 5000 + b'"]}',
            413,
            None,
            "over proxy.maxBodyBytes (4,096 bytes)",
        ),
    ],
    ids=["malformed", "empty", "array", "no-messages", "messages-str", "model-int", "too-big"],
)
def test_bad_requests_are_refused_and_not_forwarded(
    server_url: str, standin: StandIn, body: bytes, status: int, param: str | None, message: str
) -> None:
    r = _post(server_url, body)
    assert r.status_code == status
    error = _error(r)
    assert message in str(error["message"])
    assert error["param"] == param
    assert standin.received == []


def test_body_over_limit_without_content_length_is_413(server_url: str, standin: StandIn) -> None:
    def chunks():  # type: ignore[no-untyped-def]
        yield b'{"model": "m", "messages": ["'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"]}'

    r = httpx.post(
        f"{server_url}/chat/completions",
        content=chunks(),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413
    assert standin.received == []


def test_bad_budget_header_is_400(server_url: str, standin: StandIn) -> None:
    r = _post(server_url, b'{"model":"m","messages":[]}', **{"x-context-budget": "maybe"})
    assert r.status_code == 400
    assert _error(r)["message"] == "header x-context-budget must be 'on' or 'off', got 'maybe'"
    assert standin.received == []


def test_upstream_429_keeps_status_and_retry_after(server_url: str, standin: StandIn) -> None:
    client = sdk(base_url=server_url, api_key="sk-x", max_retries=0)
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"x_standin": {"status": 429, "retry_after": "7"}},
        )
    assert info.value.status_code == 429
    assert info.value.response.headers["retry-after"] == "7"
    assert info.value.response.headers["x-context-budget-request-id"].startswith("cb-")


@pytest.mark.parametrize("status", [500, 503])
def test_upstream_5xx_keeps_status(server_url: str, standin: StandIn, status: int) -> None:
    r = _post(
        server_url,
        b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}],'
        b'"x_standin":{"status":%d}}' % status,
    )
    assert r.status_code == status
    _error(r)


def test_upstream_timeout_is_504(tmp_path: Path, standin: StandIn) -> None:
    config = base_config(tmp_path, standin.base_url)
    config["proxy"]["upstream"]["readTimeoutSeconds"] = 0.5
    with serve(tmp_path, config) as server:
        r = _post(
            server.base_url,
            b'{"model":"m","messages":[{"role":"user","content":"hi"}],"x_standin":{"delay":3}}',
        )
    assert r.status_code == 504
    assert "did not answer within 0.5 s" in str(_error(r)["message"])


def test_unknown_route_is_openai_shaped_404(server_url: str) -> None:
    r = httpx.get(server_url.replace("/v1", "/nope"))
    assert r.status_code == 404
    assert "no route /nope" in str(_error(r)["message"])


def test_client_disconnect_closes_the_upstream_stream(tmp_path: Path, standin: StandIn) -> None:
    with serve(tmp_path, base_config(tmp_path, standin.base_url)) as server:
        body = {
            "model": "m",
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
            "x_standin": {"endless": True, "chunk_delay": 0.05},
        }
        before = standin.streams_cancelled
        with httpx.stream("POST", f"{server.base_url}/chat/completions", json=body) as r:
            lines = r.iter_lines()
            for _ in range(3):
                next(lines)
        deadline = time.monotonic() + 10
        while standin.streams_cancelled == before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert standin.streams_cancelled == before + 1
        recent = server.report()["recent"][0]
        assert recent["upstreamError"] == "client disconnected"


def test_models_pass_through(tmp_path: Path, standin: StandIn) -> None:
    with serve(tmp_path, base_config(tmp_path, standin.base_url)) as server:
        models = sdk(base_url=server.base_url, api_key="sk-x").models.list()
        assert [m.id for m in models.data]
        assert standin.received[0].path == "/v1/models"


def test_the_proxys_own_errors_raise_each_sdks_typed_error(
    tmp_path: Path, standin: StandIn
) -> None:
    """No route and wrong method come back in the route's own format: an Anthropic client
    got OpenAI's shape on /v1/messages (issue 24, item 11)."""
    with serve(tmp_path, standin_config(tmp_path, standin)) as server:
        claude = tracked(anthropic.Anthropic(base_url=server.root, api_key="sk-ant", max_retries=0))
        with pytest.raises(anthropic.NotFoundError) as missing:
            claude.messages.batches.create(
                requests=[
                    {
                        "custom_id": "a",
                        "params": {
                            "model": "m",
                            "max_tokens": 5,
                            "messages": [{"role": "user", "content": "hi"}],
                        },
                    }
                ]
            )
        assert missing.value.type == "not_found_error"
        assert missing.value.body["type"] == "error"  # type: ignore[index]
        assert (missing.value.api_message or "").startswith(
            "no route /v1/messages/batches: ctxbudget serves /v1/chat/completions"
        )
        with pytest.raises(anthropic.APIStatusError) as wrong:
            claude.get("/v1/messages", cast_to=object)
        assert wrong.value.status_code == 405
        assert wrong.value.type == "invalid_request_error"
        assert wrong.value.body["type"] == "error"  # type: ignore[index]
        assert wrong.value.api_message == "GET is not allowed on /v1/messages"

        gpt = sdk(base_url=server.base_url, api_key="sk-x", max_retries=0)
        with pytest.raises(openai.NotFoundError) as gone:
            gpt.responses.retrieve("resp_1")
        assert gone.value.code == "not_found"
        assert "no route /v1/responses/resp_1: ctxbudget serves" in gone.value.message
        with pytest.raises(openai.NotFoundError) as nowhere:
            gpt.post("/chat/completions/x", cast_to=object, body={})
        assert "no route /v1/chat/completions/x" in nowhere.value.message
        with pytest.raises(openai.APIStatusError) as method:
            gpt.get("/chat/completions", cast_to=object)
        assert (method.value.status_code, method.value.code) == (405, "method_not_allowed")
        assert method.value.body == {
            "message": "GET is not allowed on /v1/chat/completions",
            "type": "invalid_request_error",
            "param": None,
            "code": "method_not_allowed",
        }
    assert standin.received == []


_KEY = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
_V13 = "Sec-WebSocket-Version: 13\r\n"
_HANDSHAKES = {
    "Codex's": f"GET /v1/responses HTTP/1.1\r\n{_KEY}{_V13}"
    "openai-beta: responses_websockets=2026-02-06\r\n",
    "an old version": f"GET /v1/responses HTTP/1.1\r\n{_KEY}Sec-WebSocket-Version: 8\r\n",
    "no key": f"GET /v1/responses HTTP/1.1\r\n{_V13}",
    "a bad key": f"GET /v1/responses HTTP/1.1\r\nSec-WebSocket-Key: abc\r\n{_V13}",
    "a POST": f"POST /v1/responses HTTP/1.1\r\n{_KEY}{_V13}Content-Length: 0\r\n",
    "another path": f"GET /v1/chat/completions HTTP/1.1\r\n{_V13}",
}
_UPGRADE = "Upgrade: websocket\r\nConnection: Upgrade\r\n\r\n"


def _handshake(port: int, head: str) -> tuple[int, dict[str, object]]:
    """Send `head` as a WebSocket upgrade; the answer's status and JSON body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"{head}Host: 127.0.0.1:{port}\r\n{_UPGRADE}".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    _, _, body = rest.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), json.loads(body)


def test_every_websocket_handshake_is_a_426_in_openai_shape(
    tmp_path: Path, standin: StandIn
) -> None:
    """Through the real server (issue 35, item 13): the websockets library under uvicorn
    answered a handshake it found malformed itself, 400 or 405 in plain text, before the
    app's 426 could; every handshake now gets the 426 with OpenAI's error body."""
    with serve(tmp_path, base_config(tmp_path, standin.base_url)) as server:
        answers = {name: _handshake(server.port, head) for name, head in _HANDSHAKES.items()}
        after = httpx.get(f"{server.root}/healthz", timeout=10)
    for name, (status, body) in answers.items():
        assert status == 426, name
        error = _error_of(body)
        assert error["code"] == "websocket_not_supported", name
        assert "supports_websockets" in str(error["message"]), name
    assert after.status_code == 200
    assert standin.received == []


def _error_of(body: dict[str, object]) -> dict[str, object]:
    error = body["error"]
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}, body
    return error


_MALFORMED = {
    # (what is sent, the wire format its path names)
    "not-http": (b"GARBAGE\r\n\r\n", "openai"),
    "bad-header-line": (
        b"POST /v1/messages HTTP/1.1\r\nHost: localhost\r\nNo colon\r\n\r\n",
        "anthropic",
    ),
    "bad-content-length": (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\ncontent-length: x\r\n\r\n",
        "openai",
    ),
    "url-of-70-kb": (
        b"POST /v1/messages?" + b"q" * 70_000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n",
        "anthropic",
    ),
}


def test_a_malformed_http_request_is_a_400_in_the_paths_wire_format(
    tmp_path: Path, standin: StandIn
) -> None:
    """Found by the round-36 attack: uvicorn answered a request its parser refused (no colon
    in a header, a bad content-length, a 70 KB URL) itself, `Invalid HTTP request received.`
    in plain text, which no SDK reads as an error; the connection answers it now, as its 408s."""
    with serve(tmp_path, base_config(tmp_path, standin.base_url)) as server:
        answers = {}
        for name, (sent, _) in _MALFORMED.items():
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                sock.sendall(sent)
                answer = b""
                while chunk := sock.recv(65536):
                    answer += chunk
            answers[name] = answer
        after = httpx.get(f"{server.root}/healthz", timeout=10)
    for name, answer in answers.items():
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 "), (name, answer[:200])
        assert b"content-type: application/json" in head.lower(), (name, head)
        found = json.loads(body)
        if _MALFORMED[name][1] == "anthropic":
            assert found["type"] == "error", name
            assert found["error"]["type"] == "invalid_request_error", name
        else:
            assert _error_of(found)["type"] == "invalid_request_error", name
    assert after.status_code == 200
    assert standin.received == []
