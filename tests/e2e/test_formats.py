"""Anthropic Messages and OpenAI Responses through the real server, with the official SDKs:
the `ctxbudget serve` process in front of the stand-in, which speaks each format's wire.

Asserted on both sides: what the upstream received (every segment within its cap, the JSON
valid, blocks, ids and `cache_control` markers where the client put them) and what the
client got back. The shared OpenClaw captures are replayed when present."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.e2e.checks import as_chat, check_received, skeleton
from tests.e2e.server import ProxyServer, sdk, serve, standin_config, tracked
from tests.openclaw import (
    INTERNAL_CONTEXT,
    format_fixtures,
    system_prompt,
    web_fetch_result,
)
from tests.standin import StandIn, StoredResponse

CAPS = {"bootstrap": 8000, "memory": 2500, "web_fetch": 8000}
MESSAGES_CAPTURES = format_fixtures("openclaw-messages")
RESPONSES_CAPTURES = format_fixtures("openclaw-responses")
PAGE = "A paragraph of a long fetched page, with words. " * 800


@pytest.fixture
def server(tmp_path: Path, standin: StandIn) -> Iterator[ProxyServer]:
    with serve(tmp_path, standin_config(tmp_path, standin)) as running:
        yield running


def claude(server: ProxyServer, **kwargs: Any) -> anthropic.Anthropic:
    return tracked(
        anthropic.Anthropic(base_url=server.root, api_key="sk-ant-client", max_retries=0, **kwargs)
    )


def markers(body: Any) -> list[str]:
    """Every `cache_control` marker, by where it sits."""
    found: list[str] = []

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict):
            if "cache_control" in value:
                found.append(f"{path}={json.dumps(value['cache_control'])}")
            for key, item in value.items():
                walk(item, f"{path}.{key}")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, f"{path}[{i}]")

    walk(body, "")
    return sorted(found)


def tool_turn() -> dict[str, Any]:
    """A Messages request with OpenClaw's system prompt and a big web_fetch result."""
    return {
        "model": "claude-test",
        "max_tokens": 256,
        "system": [
            {"type": "text", "text": system_prompt(), "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [
            {"role": "user", "content": "[Sun 2026-11-22 20:55 UTC] Fetch the page"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "I will fetch it.", "signature": "EqQBsig"},
                    {
                        "type": "tool_use",
                        "id": "toolu_01",
                        "name": "web_fetch",
                        "input": {"url": "https://example.com/page"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01",
                        "content": web_fetch_result(content=PAGE),
                        "is_error": False,
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
            {"role": "user", "content": [{"type": "text", "text": INTERNAL_CONTEXT}]},
        ],
    }


def test_messages_create_and_stream_are_clamped_and_answered(
    server: ProxyServer, standin: StandIn
) -> None:
    client = claude(server, default_headers={"anthropic-beta": "b-1"})
    body = tool_turn()
    message = client.messages.create(**body)
    assert message.role == "assistant" and message.content[0].type == "text"
    assert message.usage.input_tokens > 0
    got = standin.received[-1]
    assert got.path == "/v1/messages"
    assert got.headers["anthropic-version"] and got.headers["anthropic-beta"] == "b-1"
    # the SDK's own credential header (2.x sends `authorization: Bearer`), passed on as sent
    assert "sk-ant-client" in (
        got.headers.get("x-api-key"),
        got.headers.get("authorization", "")[7:],
    )
    clamped = check_received(as_chat(body, "messages"), as_chat(got.json, "messages"), **CAPS)
    assert clamped == {"bootstrap": 1, "memory": 0, "web_fetch": 1}
    assert skeleton({k: got.json[k] for k in body}) == skeleton(body)
    assert markers(got.json) == markers(body)

    with client.messages.stream(**body) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.stop_reason in ("end_turn", "tool_use")
    streamed = standin.received[-1].json
    assert streamed["stream"] is True and markers(streamed) == markers(body)
    entries = server.report()["recent"]
    assert [e["wire"] for e in entries[:2]] == ["messages", "messages"]
    assert all(e["clamped"] == 2 for e in entries[:2])


def test_count_tokens_counts_what_would_be_sent(server: ProxyServer, standin: StandIn) -> None:
    client = claude(server)
    body = tool_turn()
    body.pop("max_tokens")
    counted = client.messages.count_tokens(**body)
    assert counted.input_tokens > 0
    got = standin.received[-1]
    assert got.path == "/v1/messages/count_tokens"
    check_received(as_chat(body, "messages"), as_chat(got.json, "messages"), **CAPS)
    assert server.report()["recent"] == []  # counting is not a request


def test_the_command_and_errors_in_anthropic_shape(server: ProxyServer, standin: StandIn) -> None:
    client = claude(server)
    ask = [{"role": "user", "content": "/context budget"}]
    reply = client.messages.create(model="claude-x", max_tokens=9, messages=ask)
    assert "Context budget" in reply.content[0].text  # type: ignore[union-attr]
    with client.messages.stream(model="claude-x", max_tokens=9, messages=ask) as stream:
        assert "Context budget" in "".join(stream.text_stream)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="m", max_tokens=9, messages=[], system=3)  # type: ignore[arg-type]
    assert "'system' must be a string or a list of text blocks" in str(caught.value)
    orphan = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x"}]}]
    with pytest.raises(anthropic.BadRequestError, match="no earlier tool_use"):
        client.messages.create(model="m", max_tokens=9, messages=orphan)  # type: ignore[arg-type]
    assert standin.received == []


def test_responses_create_streamed_and_not(server: ProxyServer, standin: StandIn) -> None:
    client = sdk(base_url=server.base_url, api_key="sk-client", max_retries=0)
    call = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "web_fetch",
        "arguments": '{"url":"https://example.com/page"}',
    }
    items: list[Any] = [
        {
            "type": "message",
            "role": "system",
            "content": [{"type": "input_text", "text": system_prompt()}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Fetch it"}],
        },
        call,
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": web_fetch_result(content=PAGE),
        },
    ]
    response = client.responses.create(model="gpt-x", input=items, store=False)
    assert response.status == "completed" and response.output_text
    got = standin.received[-1]
    assert got.path == "/v1/responses" and got.headers["authorization"] == "Bearer sk-client"
    sent = {"input": items}
    assert check_received(as_chat(sent, "responses"), as_chat(got.json, "responses"), **CAPS) == {
        "bootstrap": 1,
        "memory": 0,
        "web_fetch": 1,
    }
    assert skeleton(got.json["input"]) == skeleton(items)
    events = list(client.responses.create(model="gpt-x", input=items, store=False, stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert server.report()["recent"][0]["wire"] == "responses"


def test_a_responses_continuation_is_clamped(server: ProxyServer, standin: StandIn) -> None:
    client = sdk(base_url=server.base_url, api_key="sk-client", max_retries=0)
    standin.script_tool = ("web_fetch", {"url": "https://example.com/page"})
    tools: list[Any] = [
        {"type": "function", "name": "web_fetch", "parameters": {"type": "object"}, "strict": False}
    ]
    first = client.responses.create(
        model="gpt-x", input="fetch the page", tools=tools, store=True, stream=True
    )
    events = list(first)
    done = events[-1]
    assert done.type == "response.completed"
    (call,) = [i for i in done.response.output if i.type == "function_call"]
    page = "Plain page text, not JSON at all. " * 800
    later = client.responses.create(
        model="gpt-x",
        previous_response_id=done.response.id,
        input=[
            {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": web_fetch_result(content=page),
            }
        ],
        tools=tools,
        store=True,
    )
    assert later.status == "completed"
    got = standin.received[-1].json
    assert got["previous_response_id"] == done.response.id
    payload = json.loads(got["input"][0]["output"])
    assert len(payload["text"]) <= 8000 and payload["truncated"] is True
    entry = server.report()["recent"][0]
    assert entry["clamped"] == 1 and done.response.id in entry["note"]


@pytest.mark.skipif(not MESSAGES_CAPTURES, reason="shared Messages captures not present")
@pytest.mark.parametrize(("name", "raw"), MESSAGES_CAPTURES, ids=[n for n, _ in MESSAGES_CAPTURES])
def test_openclaw_messages_captures_replay(
    server: ProxyServer, standin: StandIn, name: str, raw: bytes
) -> None:
    replay(server, standin, raw, "messages", path="/v1/messages")


@pytest.mark.skipif(not RESPONSES_CAPTURES, reason="shared Responses captures not present")
@pytest.mark.parametrize(
    ("name", "raw"), RESPONSES_CAPTURES, ids=[n for n, _ in RESPONSES_CAPTURES]
)
def test_openclaw_responses_captures_replay(
    server: ProxyServer, standin: StandIn, name: str, raw: bytes
) -> None:
    body = json.loads(raw)
    if "previous_response_id" in body:
        # the stand-in must know the response it continues: the call each output answers
        calls = [
            {
                "type": "function_call",
                "call_id": i["call_id"],
                "name": "memory_search",
                "arguments": "{}",
            }
            for i in body["input"]
            if i.get("type") == "function_call_output"
        ]
        standin.responses[body["previous_response_id"]] = StoredResponse(input=[], output=calls)
        known = {c["call_id"]: c["name"] for c in calls}
        replay(server, standin, raw, "responses", path="/v1/responses", known=known)
        return
    replay(server, standin, raw, "responses", path="/v1/responses")


def replay(
    server: ProxyServer,
    standin: StandIn,
    raw: bytes,
    wire: str,
    *,
    path: str,
    known: dict[str, str] | None = None,
) -> None:
    """POST a captured OpenClaw request as OpenClaw does; check what the upstream got."""
    headers = {"content-type": "application/json", "x-api-key": "sk-local"}
    headers["authorization"] = "Bearer sk-local"
    with httpx.stream(
        "POST", f"{server.root}{path}", content=raw, headers=headers, timeout=30
    ) as r:
        assert r.status_code == 200, r.read()
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events, "an SSE answer"
    for line in events:
        json.loads(line[6:])  # every event is whole JSON, as OpenClaw requires
    sent, got = json.loads(raw), standin.received[-1].json
    assert skeleton(got) == skeleton(sent)
    assert markers(got) == markers(sent)
    clamped = check_received(as_chat(sent, wire, known), as_chat(got, wire, known), **CAPS)
    assert sum(clamped.values()) >= 1
    entry = server.report()["recent"][0]
    assert entry["wire"] == wire and entry["clamped"] == sum(clamped.values())
