"""The chat completions wire adapter: turn, system text, clamp, inject, splice, replies."""

from __future__ import annotations

import asyncio

import orjson

from ctxbudget.caps import Caps, ToolNames, clamp_request
from ctxbudget.proxy.errors import BadRequest, UpstreamError
from ctxbudget.proxy.wire import ChatCompletions
from tests.inproc import settings
from tests.openclaw import INTERNAL_CONTEXT, openclaw_request

CHAT = ChatCompletions()


def test_the_user_turn_skips_internal_context_and_knows_a_tool_loop() -> None:
    body = openclaw_request(version="9.x", stream=False)
    request = CHAT.parse(orjson.dumps(body))
    turn = request.user_turn()
    assert turn is not None
    assert turn.index == 1
    assert turn.query == "Please fetch the page and check memory."
    assert turn.last is False  # tool results follow it
    own = CHAT.parse(
        orjson.dumps(
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "user", "content": [{"type": "text", "text": INTERNAL_CONTEXT}]},
                ],
            }
        )
    ).user_turn()
    assert own is not None and own.last is True and own.query == "hi"


def test_nothing_changed_means_the_clients_bytes() -> None:
    raw = b'{"model":"m",  "messages":[{"role":"user","content":"hi"}], "tools": [1.50]}'
    request = CHAT.parse(raw)
    segments = request.clamp(clamp_request, Caps(), ToolNames(), apply=True)
    assert segments == []
    assert request.changed is False and request.encode() is raw


def test_clamping_applies_only_when_asked_and_splices_the_rest() -> None:
    body = openclaw_request(version="9.x", stream=False)
    caps = Caps(bootstrap_max_chars=8000, memory_max_chars=2500, web_fetch_max_chars=8000)
    looked = CHAT.parse(orjson.dumps(body))
    found = looked.clamp(clamp_request, caps, ToolNames(), apply=False)
    assert len([s for s in found if s.action == "clamped"]) == 4
    assert looked.changed is False
    clamped = CHAT.parse(orjson.dumps(body))
    clamped.clamp(clamp_request, caps, ToolNames(), apply=True)
    out = orjson.loads(clamped.encode())
    assert clamped.changed is True
    assert {k: v for k, v in out.items() if k != "messages"} == {
        k: v for k, v in body.items() if k != "messages"
    }
    assert len(out["messages"]) == len(body["messages"])


def test_injection_goes_to_the_last_user_message_or_the_system_prompt() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "two"},
            {"role": "user", "content": "three"},
        ],
    }
    user = CHAT.parse(orjson.dumps(body))
    user.inject(["- Fact: x (today, you told me)"], "user")
    messages = orjson.loads(user.encode())["messages"]
    assert messages[3]["content"] == "three\n\nUser context:\n- Fact: x (today, you told me)"
    assert messages[:3] == body["messages"][:3]
    system = CHAT.parse(orjson.dumps(body))
    system.inject(["- Fact: x (today, you told me)"], "system")
    assert orjson.loads(system.encode())["messages"][0]["content"].startswith(
        "sys\n\nUser context:"
    )
    assert system.system_text() == "sys\n\nUser context:\n- Fact: x (today, you told me)"


def test_bad_bodies_are_bad_requests() -> None:
    for raw in (b"", b"[]", b'{"messages": 1}', b"{"):
        try:
            CHAT.parse(raw)
        except BadRequest:
            continue
        raise AssertionError(f"{raw!r} parsed")


def test_command_replies_are_chat_completions() -> None:
    request = CHAT.parse(b'{"model": "m", "messages": [], "stream": false}')
    reply = CHAT.command_reply("report text", request, request_id="cb-1")
    assert reply.media_type == "application/json"
    assert isinstance(reply.body, bytes)
    data = orjson.loads(reply.body)
    assert (data["id"], data["model"]) == ("chatcmpl-cb-1", "m")
    assert data["choices"][0]["message"] == {"role": "assistant", "content": "report text"}

    streamed = CHAT.parse(
        b'{"model": "m", "messages": [], "stream": true, "stream_options": {"include_usage": true}}'
    )
    reply = CHAT.command_reply("x" * 900, streamed, request_id="cb-2")
    assert reply.media_type == "text/event-stream"
    assert not isinstance(reply.body, bytes)

    async def collect() -> list[bytes]:
        return [c async for c in reply.body]  # type: ignore[union-attr]

    events = asyncio.run(collect())
    assert events[-1] == b"data: [DONE]\n\n"
    payloads = [orjson.loads(e[6:]) for e in events[:-1]]
    assert "".join(
        p["choices"][0]["delta"].get("content", "") for p in payloads if p["choices"]
    ) == ("x" * 900)
    assert payloads[-1]["usage"] == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    assert all(p["model"] == "m" for p in payloads)


def test_errors_are_openai_shaped_in_json_and_in_a_stream() -> None:
    error = UpstreamError("upstream stream broke: boom")
    assert CHAT.error_body(error)["error"]["message"] == "upstream stream broke: boom"
    event = CHAT.stream_error(error)
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert orjson.loads(event[6:]) == error.to_dict()


def test_upstream_target_and_credentials() -> None:
    plain = settings(upstream={"baseUrl": "http://up/v1", "apiKeyEnv": None})
    assert CHAT.upstream_url(plain, "/v1/chat/completions", "") == "http://up/v1/chat/completions"
    assert CHAT.upstream_url(plain, "/chat/completions", "a=1") == (
        "http://up/v1/chat/completions?a=1"
    )
    client = {"authorization": "Bearer client", "x-a": "1"}
    keyed = settings(env={"UP": "sk-up", "KEYS": "pk"}, upstream={"apiKeyEnv": "UP"})
    assert CHAT.upstream_headers(client, keyed)["authorization"] == "Bearer sk-up"
    proxy_key = {"authorization": "Bearer pk", "x-api-key": "pk", "x-a": "1"}
    sent = CHAT.upstream_headers(proxy_key, settings(env={"KEYS": "pk"}))
    assert "authorization" not in sent and "x-api-key" not in sent  # a proxy key stays here
    assert CHAT.upstream_headers(client, plain)["authorization"] == "Bearer client"
