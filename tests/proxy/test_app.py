"""The app's own errors (no route, wrong method, a bug) in the client's wire format, and no
traceback for any malformed request on any route (issue 24, items 11 and 12)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

from tests.fakes import FakeReply, FakeUpstream
from tests.inproc import InProcess, proxy_app

ANTHROPIC = ("/v1/messages", "/messages")


class BrokenUpstream(FakeUpstream):
    """An upstream client with a bug: what reaches the app's last-resort handler."""

    async def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None,
        headers: Mapping[str, str],
        connect_timeout: float,
        read_timeout: float,
    ) -> FakeReply:
        raise RuntimeError("a bug, with a secret in its text: sk-Z9")


def _anthropic_error(r: httpx.Response, kind: str) -> str:
    body = r.json()
    assert body["type"] == "error" and set(body) == {"type", "error"}, body
    assert body["error"]["type"] == kind, body
    message: str = body["error"]["message"]
    return message


def _openai_error(r: httpx.Response, code: str) -> str:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code, body
    message: str = body["error"]["message"]
    return message


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("POST", "/v1/messages/batches", 404),
        ("GET", "/v1/messages", 405),
        ("GET", "/messages/count_tokens", 405),
        ("POST", "/v1/chat/completions/x", 404),
        ("GET", "/v1/chat/completions", 405),
        ("GET", "/v1/responses/resp_1", 404),
        ("PUT", "/v1/responses", 405),
        ("POST", "/healthz", 405),
        ("GET", "/nope", 404),
    ],
)
def test_no_route_and_wrong_method_answer_in_the_routes_format(
    tmp_path: Path, method: str, path: str, status: int
) -> None:
    with proxy_app(tmp_path) as (client, fake):
        r = client.request(method, path, content=b"{}")
    assert r.status_code == status
    if path.startswith(ANTHROPIC):
        kind = "not_found_error" if status == 404 else "invalid_request_error"
        message = _anthropic_error(r, kind)
    else:
        message = _openai_error(r, "not_found" if status == 404 else "method_not_allowed")
    if status == 404:
        assert message.startswith(f"no route {path}: ctxbudget serves /v1/chat/completions")
    else:
        assert message == f"{method} is not allowed on {path}"
        assert r.headers["allow"]
    assert fake.sent == []


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/messages", {"model": "m", "max_tokens": 5, "messages": []}),
        ("/v1/chat/completions", {"model": "m", "messages": []}),
        ("/v1/responses", {"model": "m", "input": "hi"}),
    ],
)
def test_a_bug_is_a_500_in_the_routes_format_naming_only_its_class(
    tmp_path: Path, path: str, body: dict[str, Any]
) -> None:
    with proxy_app(tmp_path, upstream=BrokenUpstream()) as (client, _):
        r = client.post(path, json=body)
    assert r.status_code == 500
    if path.startswith(ANTHROPIC):
        message = _anthropic_error(r, "api_error")
    else:
        message = _openai_error(r, "internal_error")
    assert message == "internal error in ctxbudget: RuntimeError"


def _sdk_error(client: InProcess, call: Any) -> Any:
    """What an SDK call over the in-process app raised (run on the app's own loop)."""

    async def go() -> BaseException:
        try:
            await call()
        except Exception as exc:
            return exc
        raise AssertionError("no error raised")

    return client._run(go())


def test_the_anthropic_sdk_raises_its_own_typed_error_for_a_bug(tmp_path: Path) -> None:
    with proxy_app(tmp_path, upstream=BrokenUpstream()) as (client, _):
        transport = httpx2.ASGITransport(
            app=client.app, raise_app_exceptions=False
        )  # this SDK's own httpx fork
        claude = anthropic.AsyncAnthropic(
            base_url="http://127.0.0.1:4141",
            api_key="sk-ant",
            max_retries=0,
            http_client=httpx2.AsyncClient(transport=transport),
        )
        error = _sdk_error(
            client,
            lambda: claude.messages.create(
                model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
            ),
        )
        client._run(claude.close())
    assert isinstance(error, anthropic.InternalServerError)
    assert error.type == "api_error"
    assert error.api_message == "internal error in ctxbudget: RuntimeError"


def test_the_openai_sdk_raises_its_own_typed_error_for_a_bug(tmp_path: Path) -> None:
    with proxy_app(tmp_path, upstream=BrokenUpstream()) as (client, _):
        transport = httpx.ASGITransport(app=client.app, raise_app_exceptions=False)
        gpt = openai.AsyncOpenAI(
            base_url="http://127.0.0.1:4141/v1",
            api_key="sk",
            max_retries=0,
            http_client=httpx.AsyncClient(transport=transport),
        )
        error = _sdk_error(client, lambda: gpt.responses.create(model="m", input="hi"))
        client._run(gpt.close())
    assert isinstance(error, openai.InternalServerError)
    assert error.code == "internal_error"
    assert error.message.startswith("Error code: 500")
    assert error.body == {
        "message": "internal error in ctxbudget: RuntimeError",
        "type": "server_error",
        "param": None,
        "code": "internal_error",
    }
