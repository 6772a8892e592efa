"""The app's own errors (no route, wrong method, a bug) in the client's wire format, and no
traceback for any malformed request on any route (issue 24, items 11 and 12)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


# -- malformed input on every route: a 4xx that says what to fix, never a 5xx or a traceback --

ROUTES = [
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/v1/models",
    "/metrics",
    "/context/budget",
    "/context/budget/requests/cb-1",
    "/healthz",
    "/v1/memories",
    "/v1/memories/1",
    "/v1/memories/x",
]
CONTENT_TYPES = [None, "application/json", "text/plain", "multipart/form-data; boundary=x"]
BODIES = [
    b"",
    b"null",
    b"[1]",
    b"{}",
    b'{"model": "m"',
    b"\xff\xfe",
    b'{"model": "m", "messages": [{"role": "user"}], "input": 5, "max_tokens": "x"}',
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true}',
    b'{"model": "m", "input": [null], "text": 5, "messages": "x", "stream": "yes"}',
    b'{"model": 1e999, "messages": [{"role": "tool", "tool_call_id": 5, "content": [1]}]}',
]


def test_no_route_answers_a_5xx_or_a_traceback_for_malformed_input(tmp_path: Path) -> None:
    seen: dict[int, int] = {}
    with proxy_app(tmp_path) as (client, fake):
        for path in ROUTES:
            for method in ("GET", "POST", "PUT", "DELETE", "OPTIONS"):
                for content_type in CONTENT_TYPES:
                    for body in BODIES:
                        headers = {"content-type": content_type} if content_type else {}
                        r = client.request(method, path, content=body, headers=headers)
                        seen[r.status_code] = seen.get(r.status_code, 0) + 1
                        where = (method, path, content_type, body)
                        assert r.status_code < 500, (where, r.text)
                        assert "Traceback" not in r.text and 'File "' not in r.text, where
                        if r.status_code >= 400:  # an error the client's SDK can read
                            assert "message" in r.text, (where, r.text)
    assert {400, 404, 405, 415} <= set(seen)


def test_a_client_that_leaves_while_sending_its_body_is_no_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Half a body, then the connection closed: logged as a bug with two tracebacks and
    re-raised into the server before (issue 24, item 12)."""

    async def half_a_body(app: Any, path: str) -> list[dict[str, Any]]:
        events = [
            {"type": "http.request", "body": b'{"model": "m", ', "more_body": True},
            {"type": "http.disconnect"},
        ]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return events.pop(0) if events else {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"127.0.0.1:4141"), (b"content-type", b"application/json")],
            "client": ("127.0.0.1", 5000),
            "server": ("127.0.0.1", 4141),
            "state": {},
        }
        await app(scope, receive, send)
        return sent

    with proxy_app(tmp_path) as (client, fake):
        for path in ("/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/memories"):
            sent = client._run(half_a_body(client.app, path))
            assert sent[0]["status"] == 499, path
    assert fake.sent == []
    assert [r for r in caplog.records if r.levelname == "ERROR"] == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_an_odd_responses_reply_is_relayed_as_it_came(tmp_path: Path, stream: bool) -> None:
    """A reply whose `output` is not a list (a gateway's own shape) was a 500 after the
    upstream had answered 200, or a broken stream (issue 24, item 12)."""
    odd = {"id": "resp_odd", "object": "response", "output": 1.5}
    with proxy_app(tmp_path) as (client, fake):
        if stream:
            event = {"type": "response.created", "response": odd}
            fake.answer_sse([b"event: response.created\ndata: " + orjson.dumps(event) + b"\n\n"])
        else:
            fake.answer_json(odd)
        r = client.post("/v1/responses", json={"model": "m", "input": "hi", "stream": stream})
    assert r.status_code == 200
    assert (orjson.dumps(odd) in r.content) if stream else (r.json() == odd)
    assert b"event: error" not in r.content


_KEYS = [
    "model", "messages", "role", "content", "type", "tool_calls", "function", "arguments",
    "name", "id", "tool_call_id", "tool_use_id", "input", "instructions", "call_id", "output",
    "system", "stream", "metadata", "user_id", "previous_response_id", "text", "tools",
    "cache_control", "max_tokens", "prompt_cache_key", "stream_options", "scope", "category",
]  # fmt: skip
_WORDS = [
    "user", "assistant", "system", "tool", "developer", "text", "tool_use", "tool_result",
    "function_call", "function_call_output", "message", "input_text", "/context budget",
    "/ctxbudget json", "web_fetch", "memory_get", "call_1", "m", "# Project Context\n## /w/A.md\nx",
]  # fmt: skip
_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(_WORDS),
    st.text(max_size=20),
)
_JSON = st.recursive(
    _LEAF,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(_KEYS), inner, max_size=5)
    ),
    max_leaves=30,
)


_FIELDS = ("messages", "input", "system", "instructions", "metadata", "stream", "tools")
_BODY = st.one_of(
    st.fixed_dictionaries({"model": st.just("m")}, optional=dict.fromkeys(_FIELDS, _JSON)), _JSON
)


def test_random_json_of_each_formats_words_is_never_a_5xx(tmp_path: Path) -> None:
    routes = ["/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/memories"]
    with proxy_app(tmp_path) as (client, _):
        # the same examples every run: a regression guard, not a lottery
        @settings(max_examples=150, deadline=None, database=None, derandomize=True)
        @given(route=st.sampled_from(routes), body=_BODY)
        def check(route: str, body: Any) -> None:
            raw = json.dumps(body).encode()  # orjson refuses ints past 64 bits; clients do not
            r = client.post(route, content=raw, headers={"content-type": "application/json"})
            assert r.status_code < 500 and "Traceback" not in r.text, (route, raw, r.text)

        check()


def test_start_up_objects_are_frozen_out_of_the_collector_once_a_process(tmp_path: Path) -> None:
    """A started app moves what start-up made out of the collector's full passes (they walked
    it on every pass), once a process: a second app's objects stay collectable."""
    import gc

    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    with proxy_app(tmp_path / "one") as (client, _):
        assert client.get("/healthz").status_code == 200
        frozen = gc.get_freeze_count()
    assert frozen > 10_000
    with proxy_app(tmp_path / "two") as (client, _):
        assert client.get("/healthz").status_code == 200
        assert gc.get_freeze_count() <= frozen  # (frozen objects still die by refcount)


# -- the route table: what is served where, and create_app only mounts it --

SURFACE = [
    # the pipeline's routes, each with its alias without /v1 (OpenClaw's baseUrl may omit it)
    ("/v1/chat/completions", ["POST"], "serve"),
    ("/chat/completions", ["POST"], "serve"),
    ("/v1/messages", ["POST"], "serve"),
    ("/messages", ["POST"], "serve"),
    ("/v1/messages/count_tokens", ["POST"], "serve"),
    ("/messages/count_tokens", ["POST"], "serve"),
    ("/v1/responses", ["POST"], "serve"),
    ("/responses", ["POST"], "serve"),
    ("/v1/models", ["GET", "HEAD"], "models"),
    ("/metrics", ["GET", "HEAD"], "prometheus"),
    ("/context/budget", ["GET", "HEAD"], "budget"),
    ("/context/budget/requests/{id}", ["GET", "HEAD"], "budget_request"),
    ("/healthz", ["GET", "HEAD"], "healthz"),
    ("/v1/memories", ["POST"], "add"),
    ("/v1/memories", ["GET", "HEAD"], "list"),
    ("/v1/memories/{id}", ["DELETE"], "remove"),
    ("/{path:path}", [], "refuse"),  # any WebSocket handshake: 426
]
"""DESIGN.md's HTTP surface as mounted: path, methods and Starlette's name, in match order."""


def test_the_app_serves_the_documented_routes_under_their_names(tmp_path: Path) -> None:
    with proxy_app(tmp_path) as (client, fake):
        mounted = [
            (r.path, sorted(getattr(r, "methods", None) or ()), r.name) for r in client.app.routes
        ]
        fake.answer_json({"object": "list", "data": [{"id": "gpt-4o", "object": "model"}]})
        models = client.get("/v1/models")
        health = client.get("/healthz")
        metrics = client.get("/metrics")
    assert mounted == SURFACE
    assert models.json()["data"] == [{"id": "gpt-4o", "object": "model"}]
    assert [s.url for s in fake.sent] == ["http://upstream.test/v1/models"]
    assert health.json() == {"status": "ok", "service": "ctxbudget"}
    assert metrics.status_code == 200 and "ctxbudget_" in metrics.text


def test_every_handler_lives_in_routes_or_the_pipeline_and_create_app_defines_none(
    tmp_path: Path,
) -> None:
    """create_app builds the state and the pipeline and mounts one table: a handler written
    inside it is one more thing to read there, and untestable on its own."""
    import ast

    import ctxbudget.proxy.app

    with proxy_app(tmp_path) as (client, _):
        homes = {r.path: r.endpoint.__module__ for r in client.app.routes}  # type: ignore[attr-defined]
    elsewhere = {
        path: home
        for path, home in homes.items()
        if not home.startswith(("ctxbudget.proxy.routes.", "ctxbudget.proxy.pipeline."))
    }
    assert elsewhere == {}
    tree = ast.parse(Path(ctxbudget.proxy.app.__file__).read_text())
    [factory] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "create_app"]
    nested = [
        getattr(n, "name", "lambda")
        for n in ast.walk(factory)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) and n is not factory
    ]
    assert nested == []
