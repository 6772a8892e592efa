"""The provider's usage, read from every format's replies, JSON and SSE; and chat streams
whose client did not ask for usage, asked for it with the usage chunk hidden."""

from __future__ import annotations

import doctest
import json
from pathlib import Path
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxbudget.proxy.report.usage
from ctxbudget.proxy.errors import UpstreamError
from ctxbudget.proxy.report.usage import Usage, UsageChunkDropper, UsageReader
from tests.fakes import FakeReply, FakeUpstream, Sent, chat_chunks, chat_completion
from tests.inproc import config_for, proxy_app

ANTHROPIC = "http://anthropic.test"
CHAT_USAGE = {
    "prompt_tokens": 1200,
    "completion_tokens": 40,
    "total_tokens": 1240,
    "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
}
MESSAGES_USAGE = {
    "input_tokens": 12,
    "cache_creation_input_tokens": 300,
    "cache_read_input_tokens": 2000,
    "output_tokens": 55,
}
RESPONSES_USAGE = {
    "input_tokens": 5000,
    "input_tokens_details": {"cached_tokens": 4096},
    "output_tokens": 70,
    "output_tokens_details": {"reasoning_tokens": 20},
    "total_tokens": 5070,
}


def test_doctests() -> None:
    assert doctest.testmod(ctxbudget.proxy.report.usage).failed == 0


def sse(event: str | None, data: Any) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


def messages_stream() -> list[bytes]:
    start = {"id": "msg_1", "model": "claude-x", "content": [], "usage": {**MESSAGES_USAGE}}
    start["usage"]["output_tokens"] = 1
    return [
        sse("message_start", {"type": "message_start", "message": start}),
        sse("ping", {"type": "ping"}),
        sse(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"text": 'say "usage"'}},
        ),
        sse("message_delta", {"type": "message_delta", "usage": {"output_tokens": 55}}),
        sse("message_stop", {"type": "message_stop"}),
    ]


def responses_stream() -> list[bytes]:
    created = {"id": "resp_1", "status": "in_progress", "usage": None}
    done = {"id": "resp_1", "status": "completed", "usage": RESPONSES_USAGE}
    return [
        sse("response.created", {"type": "response.created", "response": created}),
        sse("response.output_text.delta", {"type": "response.output_text.delta", "delta": "x"}),
        sse("response.completed", {"type": "response.completed", "response": done}),
    ]


def chat_stream_with(usage: dict[str, Any]) -> list[bytes]:
    chunks = chat_chunks("hello there")
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks.insert(-1, sse(None, {**base, "choices": [], "usage": usage}))
    return chunks


def test_anthropic_cache_writes_by_lifetime_json_and_sse() -> None:
    usage = {
        **MESSAGES_USAGE,
        "cache_creation": {"ephemeral_5m_input_tokens": 100, "ephemeral_1h_input_tokens": 200},
    }
    expected = Usage(input=12, cache_read=2000, cache_write=300, output=55, cache_write_1h=200)
    body = orjson.dumps({"id": "msg_1", "content": [], "usage": usage})
    assert UsageReader("messages").read_json(body) == expected
    start = {"id": "msg_1", "model": "claude-x", "content": [], "usage": {**usage}}
    reader = UsageReader("messages")
    reader.feed(sse("message_start", {"type": "message_start", "message": start}))
    reader.feed(sse("message_delta", {"type": "message_delta", "usage": {"output_tokens": 55}}))
    assert reader.result() == expected
    # only the split, no total: the total is its sum
    alone = {"input_tokens": 1, "output_tokens": 1, "cache_creation": usage["cache_creation"]}
    assert UsageReader("messages").read_json(orjson.dumps({"usage": alone})) == Usage(
        input=1, cache_read=0, cache_write=300, output=1, cache_write_1h=200
    )


def test_litellm_chat_usage_of_an_anthropic_model_keeps_the_lifetimes() -> None:
    usage = {
        "prompt_tokens": 1500,
        "completion_tokens": 9,
        "prompt_tokens_details": {
            "cached_tokens": 1000,
            "cache_write_tokens": 400,
            "cache_creation_token_details": {
                "ephemeral_5m_input_tokens": 0,
                "ephemeral_1h_input_tokens": 400,
            },
        },
    }
    assert UsageReader("chat").read_json(orjson.dumps({"usage": usage})) == Usage(
        input=100, cache_read=1000, cache_write=400, output=9, cache_write_1h=400
    )


EXPECTED = {
    "chat": Usage(input=176, cache_read=1024, cache_write=0, output=40),
    "messages": Usage(input=12, cache_read=2000, cache_write=300, output=55),
    "responses": Usage(input=904, cache_read=4096, cache_write=0, output=70),
}


def test_json_usage_of_every_format() -> None:
    bodies = {
        "chat": {**chat_completion(), "usage": CHAT_USAGE},
        "messages": {"id": "msg_1", "content": [], "usage": MESSAGES_USAGE},
        "responses": {"id": "resp_1", "output": [], "usage": RESPONSES_USAGE},
    }
    for wire, body in bodies.items():
        pretty = json.dumps(body, indent=2).encode()  # line breaks do not matter
        assert UsageReader(wire).read_json(pretty) == EXPECTED[wire], wire


def test_the_replys_id_and_model_come_with_its_usage() -> None:
    """What OpenTelemetry's gen_ai.response.* come from, in every format (they were read for
    chat only, from a second copy of the reply's last usage-bearing bytes)."""
    streams = {
        "chat": (chat_stream_with(CHAT_USAGE), "chatcmpl-fake", "m"),
        "messages": (messages_stream(), "msg_1", "claude-x"),
        "responses": (
            [
                e.replace(b'"id":"resp_1"', b'"id":"resp_1","model":"gpt-x"')
                for e in responses_stream()
            ],
            "resp_1",
            "gpt-x",
        ),
    }
    for wire, (events, response_id, model) in streams.items():
        reader = UsageReader(wire)
        for event in events:
            reader.feed(event)
        assert (reader.response_id, reader.response_model) == (response_id, model), wire


def test_no_usage_is_none() -> None:
    assert UsageReader("chat").read_json(b'{"choices": []}') is None
    reader = UsageReader("chat")
    for chunk in chat_chunks("hi"):
        reader.feed(chunk)
    assert reader.result() is None
    assert UsageReader("responses").read_json(b'{"usage": null}') is None


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_sse_usage_of_every_format_in_any_chunking(data: st.DataObject) -> None:
    streams = {
        "chat": chat_stream_with(CHAT_USAGE),
        "messages": messages_stream(),
        "responses": responses_stream(),
    }
    for wire, events in streams.items():
        raw = b"".join(events).replace(b"\n", b"\r\n") if data.draw(st.booleans()) else None
        whole = raw or b"".join(events)
        cuts = sorted(data.draw(st.sets(st.integers(0, len(whole)), max_size=12)))
        reader = UsageReader(wire)
        for a, b in zip([0, *cuts], [*cuts, len(whole)], strict=True):
            reader.feed(whole[a:b])
        assert reader.result() == EXPECTED[wire], wire


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_dropper_removes_exactly_the_usage_chunk(data: st.DataObject) -> None:
    crlf = data.draw(st.booleans())
    asked = b"".join(chat_stream_with(CHAT_USAGE))
    unasked = b"".join(chat_chunks("hello there"))
    if crlf:
        asked, unasked = asked.replace(b"\n", b"\r\n"), unasked.replace(b"\n", b"\r\n")
    cuts = sorted(data.draw(st.sets(st.integers(0, len(asked)), max_size=20)))
    dropper = UsageChunkDropper()
    out = [dropper.feed(asked[a:b]) for a, b in zip([0, *cuts], [*cuts, len(asked)], strict=True)]
    out.append(dropper.close())
    assert b"".join(out) == unasked


def test_usage_null_in_every_chunk_is_not_parsed_and_not_dropped() -> None:
    """OpenAI's stream with include_usage: `"usage":null` in every chunk but the last."""
    chunks = [c.replace(b'"choices"', b'"usage":null,"choices"') for c in chat_chunks("a b")]
    stream = chunks[:-1] + [sse(None, {"choices": [], "usage": CHAT_USAGE}), chunks[-1]]
    reader, dropper = UsageReader("chat"), UsageChunkDropper()
    out = b""
    for chunk in stream:
        reader.feed(chunk)
        out += dropper.feed(chunk)
    assert out + dropper.close() == b"".join(chunks)
    assert reader.result() == EXPECTED["chat"]


def test_dropper_keeps_chunks_with_choices_and_an_unfinished_tail() -> None:
    usage_with_choice = sse(None, {"choices": [{"delta": {}}], "usage": {"prompt_tokens": 1}})
    dropper = UsageChunkDropper()
    assert dropper.feed(usage_with_choice + b"data: [DO") == usage_with_choice
    assert dropper.close() == b"data: [DO"


# -- through the pipeline ------------------------------------------------------------------


def chat_body(**more: Any) -> dict[str, Any]:
    return {"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}], **more}


def entry(client: Any, response: Any) -> dict[str, Any]:
    rid = response.headers["x-context-budget-request-id"]
    found: dict[str, Any] = client.get(f"/context/budget/requests/{rid}").json()
    return found


def test_chat_json_usage_in_the_report(tmp_path: Path) -> None:
    with proxy_app(tmp_path) as (client, fake):
        fake.answer_json({**chat_completion(), "usage": CHAT_USAGE})
        r = client.post("/v1/chat/completions", json=chat_body())
        assert entry(client, r)["usage"] == {
            "input": 176,
            "cacheRead": 1024,
            "cacheWrite": 0,
            "output": 40,
            "cacheWrite1h": 0,
        }


def test_chat_stream_asks_for_usage_and_hides_it(tmp_path: Path) -> None:
    raw = orjson.dumps(chat_body(stream=True, stream_options={"foo": 1}))
    with proxy_app(tmp_path) as (client, fake):
        fake.answer_sse(chat_stream_with(CHAT_USAGE))
        r = client.post("/v1/chat/completions", content=raw)
        assert r.content == b"".join(chat_chunks("hello there"))  # byte for byte
        sent = fake.last.json
        assert sent["stream_options"] == {"foo": 1, "include_usage": True}
        assert sent["messages"] == chat_body()["messages"]
        assert entry(client, r)["usage"] == EXPECTED["chat"].to_dict()


def test_chat_stream_that_asked_is_untouched(tmp_path: Path) -> None:
    raw = orjson.dumps(chat_body(stream=True, stream_options={"include_usage": True}))
    with proxy_app(tmp_path) as (client, fake):
        fake.answer_sse(chat_stream_with(CHAT_USAGE))
        r = client.post("/v1/chat/completions", content=raw)
        assert fake.last.body == raw
        assert r.content == b"".join(chat_stream_with(CHAT_USAGE))
        assert entry(client, r)["usage"] == EXPECTED["chat"].to_dict()


def test_request_usage_false_forwards_the_body_as_sent(tmp_path: Path) -> None:
    config = config_for(
        tmp_path,
        agents={"defaults": {"contextBudget": {"enabled": False}}},
        report={"requestUsage": False},
        memory={"inject": {"enabled": False}},
    )
    raw = b'{"model": "gpt-x",  "stream": true, "messages": [{"role": "user", "content": "hi"}]}'
    with proxy_app(tmp_path, config) as (client, fake):
        fake.answer_sse(chat_chunks("hello there"))
        r = client.post("/v1/chat/completions", content=raw)
        assert fake.last.body == raw
        assert r.content == b"".join(chat_chunks("hello there"))
        assert r.headers["x-context-budget-enabled"] == "false"
        assert entry(client, r)["usage"] is None


def test_messages_usage_in_the_report(tmp_path: Path) -> None:
    anthropic = {"baseUrl": ANTHROPIC, "apiKeyEnv": None}
    body = {"model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    with proxy_app(tmp_path, config_for(tmp_path, proxy={"anthropic": anthropic})) as (
        client,
        fake,
    ):
        fake.answer_json({"id": "msg_1", "content": [], "usage": MESSAGES_USAGE})
        r = client.post("/v1/messages", json=body, headers={"x-api-key": "k"})
        assert entry(client, r)["usage"] == EXPECTED["messages"].to_dict()
        fake.answer_sse(messages_stream())
        raw = orjson.dumps({**body, "stream": True})
        r = client.post("/v1/messages", content=raw, headers={"x-api-key": "k"})
        assert fake.last.body == raw
        assert r.content == b"".join(messages_stream())
        assert entry(client, r)["usage"] == EXPECTED["messages"].to_dict()


def test_responses_usage_in_the_report(tmp_path: Path) -> None:
    body = {"model": "gpt-x", "input": "hi"}
    with proxy_app(tmp_path) as (client, fake):
        fake.answer_json({"id": "resp_1", "output": [], "usage": RESPONSES_USAGE})
        r = client.post("/v1/responses", json=body)
        assert entry(client, r)["usage"] == EXPECTED["responses"].to_dict()
        fake.answer_sse(responses_stream())
        r = client.post("/v1/responses", json={**body, "stream": True})
        assert r.content == b"".join(responses_stream())
        assert entry(client, r)["usage"] == EXPECTED["responses"].to_dict()


class _NoStreamOptions(FakeUpstream):
    """An older OpenAI-compatible server: a request with `stream_options` gets a 400."""

    async def request(self, method: str, url: str, **kwargs: Any) -> FakeReply:
        body = bytes(kwargs["body"] or b"")
        if b"stream_options" in body:
            self.sent.append(Sent(method, url, dict(kwargs["headers"]), body, 0, 0))
            message = "Unrecognized request argument supplied: stream_options"
            raise UpstreamError(
                message, status=400, body={"error": {"message": message, "type": "invalid"}}
            )
        return await super().request(method, url, **kwargs)


def test_an_upstream_that_refuses_stream_options_gets_the_clients_request(
    tmp_path: Path,
) -> None:
    fake = _NoStreamOptions()
    fake.answer_sse(chat_chunks("hi there"))
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with proxy_app(tmp_path, upstream=fake) as (client, _):
        first = client.post("/v1/chat/completions", json=body)
        second = client.post("/v1/chat/completions", json=body)
    assert first.status_code == second.status_code == 200
    assert first.content == b"".join(chat_chunks("hi there")), "the client's stream, unchanged"
    # asked once, refused, sent as the client wrote it; never asked again
    asked = [b"stream_options" in s.body for s in fake.sent if s.body]
    assert asked == [True, False, False]
    assert json.loads(fake.sent[-1].body or b"") == body
