"""The stand-in upstream speaks the wire the official SDKs parse: Anthropic Messages (JSON, SSE,
count_tokens) and OpenAI Responses (JSON, SSE, previous_response_id), with a scripted tool turn.

The `anthropic` SDK tests skip where that package is not installed; the same wire is checked
with httpx here in any case. The captured OpenClaw requests (`shared/fixtures`) are answered
too, where present.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tests.openclaw import fixture_dir
from tests.prompt_cache import (
    AnthropicCache,
    OpenAICache,
    PromptUsage,
    Rates,
    SimClock,
    canonical,
    price,
    rates,
)
from tests.standin import PlannedTurn, StandIn, StoredResponse, run_standin, tokens_of

pytestmark = pytest.mark.e2e

READ = {
    "name": "Read",
    "description": "Read a file",
    "input_schema": {
        "type": "object",
        "properties": {"file_path": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["file_path"],
    },
}
LONG = "Answer carefully, check the workspace first, and keep answers short. " * 120
"""Instructions long enough for OpenAI's automatic caching (1,024 tokens or more)."""
WRITE = {"name": "Write", "input_schema": {"type": "object", "properties": {}}}
HEADERS = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01"}
SHELL = {
    "type": "function",
    "name": "shell",
    "description": "Run a command",
    "parameters": {
        "type": "object",
        "properties": {
            "command": {"type": "array", "items": {"type": "string"}},
            "timeout_ms": {"type": "number"},
        },
        "required": ["command"],
    },
}


@pytest.fixture(scope="module")
def server() -> Iterator[StandIn]:
    with run_standin() as s:
        yield s


@pytest.fixture
def standin(server: StandIn) -> StandIn:
    server.reset()
    return server


@pytest.fixture
def client(standin: StandIn) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=standin.base_url, api_key="sk-test", max_retries=0) as c:
        yield c


def _post(standin: StandIn, path: str, body: Any, **headers: str) -> httpx.Response:
    return httpx.post(f"{standin.root}{path}", json=body, headers=headers or HEADERS, timeout=10)


def _sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) pairs of an SSE body."""
    events = []
    for block in text.split("\n\n"):
        if block.strip():
            name, data = block.split("\n", 1)
            events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _messages(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 1024, "messages": list(messages), **extra}


def _tool_result(use: dict[str, Any], content: str) -> dict[str, Any]:
    result = {"type": "tool_result", "tool_use_id": use["id"], "content": content}
    return {"role": "user", "content": [result]}


# --- Anthropic Messages over httpx ------------------------------------------------------------


def test_messages_tool_turn_as_json(standin: StandIn) -> None:
    first = _messages(_user("read it"), tools=[WRITE, READ])
    r = _post(standin, "/v1/messages", first)
    assert r.status_code == 200
    message = r.json()
    assert r.headers["request-id"].startswith("req_")
    assert message["stop_reason"] == "tool_use"
    assert [b["type"] for b in message["content"]] == ["text", "tool_use"]
    use = message["content"][1]
    assert use["id"].startswith("toolu_")
    assert (use["name"], use["input"]) == ("Read", {"file_path": "README.md"})

    assistant = {"role": "assistant", "content": message["content"]}
    second = _messages(_user("read it"), assistant, _tool_result(use, "hello"), tools=[READ])
    done = _post(standin, "/v1/messages", second).json()
    assert done["stop_reason"] == "end_turn"
    assert done["content"] == [
        {"type": "text", "text": "standin: done after tool Read; result had 5 chars"}
    ]
    assert set(done["usage"]) == {
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
        "cache_creation",
        "output_tokens",
        "service_tier",
    }


def test_messages_stream_is_anthropics_event_sequence(standin: StandIn) -> None:
    body = _messages(_user("go"), tools=[READ], stream=True)
    r = _post(standin, "/v1/messages", body)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = _sse(r.text)
    assert all(name == data["type"] for name, data in events)
    assert [name for name, _ in events] == [
        "message_start",
        "ping",
        "content_block_start",
        *["content_block_delta"] * 3,
        "content_block_stop",
        "content_block_start",
        *["content_block_delta"] * 4,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == _prompt_tokens(json.loads(r.request.content))
    assert start["usage"]["cache_read_input_tokens"] == 0
    use = events[7][1]["content_block"]
    assert use["type"] == "tool_use" and use["input"] == {} and use["name"] == "Read"
    partial = "".join(d["delta"]["partial_json"] for _, d in events[8:12])
    assert json.loads(partial) == {"file_path": "README.md"}
    assert events[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[-2][1]["usage"]["output_tokens"] >= 1
    assert standin.streams_completed >= 1


def test_messages_thinking_block_is_signed(standin: StandIn) -> None:
    thinking = {"type": "enabled", "budget_tokens": 2048}
    body = _messages(_user("hi"), thinking=thinking, stream=True)
    events = _sse(_post(standin, "/v1/messages", body).text)
    blocks = [d["content_block"]["type"] for n, d in events if n == "content_block_start"]
    assert blocks == ["thinking", "text"]
    deltas = [d["delta"]["type"] for n, d in events if n == "content_block_delta"]
    assert deltas[:4] == ["thinking_delta"] * 3 + ["signature_delta"]
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"


def test_messages_cache_usage_follows_cache_control_prefixes(standin: StandIn) -> None:
    marker = {"type": "ephemeral"}
    system = [
        {"type": "text", "text": "S" * 4000, "cache_control": marker},
        {"type": "text", "text": "now"},
    ]
    tools = [{**READ, "cache_control": marker}]
    use = {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "a"}}

    def request(*messages: dict[str, Any]) -> dict[str, Any]:
        body = _messages(*messages, system=system, tools=tools)
        return dict(_post(standin, "/v1/messages", body).json()["usage"])

    ask = {"role": "user", "content": [{"type": "text", "text": "read a", "cache_control": marker}]}
    first = request(ask)
    assert first["cache_read_input_tokens"] == 0
    assert first["cache_creation_input_tokens"] > 1000
    again = request(ask)
    assert again["cache_read_input_tokens"] == first["cache_creation_input_tokens"]
    assert again["cache_creation_input_tokens"] == 0
    assert again["input_tokens"] == first["input_tokens"]

    # the marker moves to the newest tool result, as OpenClaw does; the older prefix still hits
    plain_ask = {"role": "user", "content": [{"type": "text", "text": "read a"}]}
    result = _tool_result(use, "x" * 800)
    result["content"][0]["cache_control"] = marker
    later = request(plain_ask, {"role": "assistant", "content": [use]}, result)
    assert later["cache_read_input_tokens"] == first["cache_creation_input_tokens"]
    # written: the new blocks (the assistant's call and the result) up to the moved marker
    new_blocks = _prompt_tokens(
        _messages(plain_ask, {"role": "assistant", "content": [use]}, result)
    )
    assert later["cache_creation_input_tokens"] == new_blocks - _prompt_tokens(_messages(plain_ask))


def test_messages_cache_writes_are_split_by_lifetime_as_anthropic_reports(
    standin: StandIn,
) -> None:
    hour, minutes = {"type": "ephemeral", "ttl": "1h"}, {"type": "ephemeral"}
    system = [{"type": "text", "text": "You are a careful agent. " * 200, "cache_control": hour}]
    ask = {
        "role": "user",
        "content": [{"type": "text", "text": "hi " * 300, "cache_control": minutes}],
    }
    body = _messages(ask, system=system)
    usage = _post(standin, "/v1/messages", body).json()["usage"]
    split = usage["cache_creation"]
    # the system prompt up to its 1-hour marker, the user turn after it for 5 minutes
    assert split["ephemeral_1h_input_tokens"] == _prompt_tokens(_messages(system=system))
    assert split["ephemeral_5m_input_tokens"] > 0
    assert sum(split.values()) == usage["cache_creation_input_tokens"]
    again = _post(standin, "/v1/messages", body).json()["usage"]
    assert again["cache_creation"] == {
        "ephemeral_5m_input_tokens": 0,
        "ephemeral_1h_input_tokens": 0,
    }


def test_messages_without_cache_control_report_no_cache(standin: StandIn) -> None:
    usage = _post(standin, "/v1/messages", _messages(_user("hi"))).json()["usage"]
    assert (usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]) == (0, 0)


@pytest.mark.parametrize(
    ("body", "headers", "status", "kind", "message"),
    [
        (_messages(_user("hi")), {}, 401, "authentication_error", "x-api-key header is required"),
        (
            {"model": "m", "max_tokens": 5},
            HEADERS,
            400,
            "invalid_request_error",
            "messages: Field required",
        ),
        (
            {"model": "m", "messages": []},
            HEADERS,
            400,
            "invalid_request_error",
            "max_tokens: Field required",
        ),
        (
            _messages({"role": "tool", "content": "x"}),
            HEADERS,
            400,
            "invalid_request_error",
            'messages.0: Unexpected role "tool"',
        ),
        (
            _messages(_user("hi"), _tool_result({"id": "toolu_9"}, "x")),
            HEADERS,
            400,
            "invalid_request_error",
            "messages.1.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_9",
        ),
        (
            _messages(
                _user("hi"),
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "toolu_8", "name": "R", "input": {}}],
                },
                _user("and?"),
            ),
            HEADERS,
            400,
            "invalid_request_error",
            "messages.1: `tool_use` ids were found without `tool_result` blocks "
            "immediately after: toolu_8",
        ),
    ],
    ids=["no-key", "no-messages", "no-max-tokens", "bad-role", "stray-result", "unanswered-use"],
)
def test_messages_refuses_what_the_api_refuses(
    standin: StandIn, body: Any, headers: dict[str, str], status: int, kind: str, message: str
) -> None:
    r = httpx.post(f"{standin.root}/v1/messages", json=body, headers=headers, timeout=10)
    assert r.status_code == status
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == kind
    assert error["error"]["message"].startswith(message)


def test_messages_accept_a_system_message_and_keep_the_query(standin: StandIn) -> None:
    body = _messages({"role": "system", "content": "env"}, _user("hi"))
    r = _post(standin, "/v1/messages?beta=true", body)
    assert r.status_code == 200
    got = standin.received[-1]
    assert (got.path, got.query) == ("/v1/messages", "beta=true")
    assert r.json()["content"][0]["text"] == "standin: received 2 messages"


def test_messages_controls(standin: StandIn) -> None:
    r = _post(
        standin,
        "/v1/messages",
        _messages(_user("hi"), x_standin={"status": 529, "retry_after": "3"}),
    )
    assert r.status_code == 529
    assert r.json()["error"]["type"] == "overloaded_error"
    assert r.headers["retry-after"] == "3"
    text = _messages(_user("hi"), tools=[READ], x_standin={"tool_calls": False})
    assert _post(standin, "/v1/messages", text).json()["stop_reason"] == "end_turn"
    forced = _post(standin, "/v1/messages", _messages(_user("hi"), x_standin={"tool_calls": True}))
    assert forced.json()["content"][-1]["name"] == "web_fetch"


def test_messages_scripting_attributes_choose_the_call(standin: StandIn) -> None:
    def call(**body: Any) -> tuple[str, Any]:
        block = _post(standin, "/v1/messages", _messages(_user("go"), **body)).json()["content"][-1]
        return block.get("name", "text"), block.get("input")

    tools = [WRITE, READ]
    assert call(tools=tools) == ("Read", {"file_path": "README.md"})
    standin.tool_preference = ["Write"]
    assert call(tools=tools) == ("Write", {})
    standin.tool_preference = ["nothing-offered"]
    assert call(tools=tools) == ("Write", {})  # the request's first tool
    standin.tool_inputs = {"Write": {"file_path": "/tmp/x", "content": "y"}}
    assert call(tools=tools) == ("Write", {"file_path": "/tmp/x", "content": "y"})
    standin.script_tool = ("Bash", {"command": "ls"})
    assert call(tools=tools) == ("Bash", {"command": "ls"})
    standin.call_tools = False
    assert call(tools=tools)[0] == "text"
    standin.reset()
    assert call(tools=tools)[0] == "Read"


def test_messages_endless_stream_is_counted_when_cancelled(standin: StandIn) -> None:
    before = standin.streams_cancelled
    body = _messages(_user("hi"), stream=True, x_standin={"endless": True, "chunk_delay": 0.02})
    with httpx.stream("POST", f"{standin.root}/v1/messages", json=body, headers=HEADERS) as r:
        lines = r.iter_lines()
        for _ in range(12):
            next(lines)
    deadline = time.monotonic() + 10
    while standin.streams_cancelled == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert standin.streams_cancelled == before + 1


def test_count_tokens_counts_the_prompt_blocks(standin: StandIn) -> None:
    body = {"model": "claude-x", "messages": [_user("count me " * 40)]}
    r = _post(standin, "/v1/messages/count_tokens", body)
    assert r.json() == {"input_tokens": _prompt_tokens(body)}
    assert standin.received[-1].path == "/v1/messages/count_tokens"


# --- OpenAI Responses through the openai SDK ---------------------------------------------------


def test_responses_tool_turn_as_json(standin: StandIn, client: openai.OpenAI) -> None:
    tools: Any = [SHELL, {"type": "custom", "name": "apply_patch"}]
    prompt: Any = [{"type": "message", "role": "user", "content": "list files"}]
    create = functools.partial(
        client.responses.create, model="gpt-x", tools=tools, store=False, instructions=LONG
    )
    first = create(input=prompt)
    assert first.id.startswith("resp_") and first.status == "completed"
    [call] = first.output
    assert call.type == "function_call" and call.name == "shell"
    assert call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"command": ["echo", "standin"]}
    assert first.parallel_tool_calls is True and first.tool_choice == "auto"
    assert first.usage is not None and first.usage.input_tokens > 0
    assert first.id not in standin.responses  # store: false

    history = [*prompt, call.model_dump(exclude_none=True)]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "a\nb\n"})
    second = create(input=history)
    assert second.output_text == "standin: done after tool shell; result had 4 chars"
    assert second.usage is not None
    # the first prompt is a prefix, cached in 128-token steps (its last token never)
    assert second.usage.input_tokens_details.cached_tokens == _steps(first.usage.input_tokens - 1)


def test_responses_stream_events_and_continuation(standin: StandIn, client: openai.OpenAI) -> None:
    tools: Any = [SHELL]
    stream = client.responses.create(
        model="gpt-x", input="list files", tools=tools, stream=True, instructions=LONG
    )
    events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    completed = events[-1]
    assert completed.type == "response.completed"
    [call] = completed.response.output
    assert call.type == "function_call"
    assert standin.responses[completed.response.id].output[0]["call_id"] == call.call_id

    output: Any = [{"type": "function_call_output", "call_id": call.call_id, "output": "abc"}]
    with client.responses.stream(
        model="gpt-x",
        input=output,
        tools=tools,
        previous_response_id=completed.response.id,
        instructions=LONG,
    ) as follow:
        types = [e.type for e in follow]
        final = follow.get_final_response()
    assert types[2:8] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
    ]
    assert final.output_text == "standin: done after tool shell; result had 3 chars"
    assert final.previous_response_id == completed.response.id
    assert final.usage is not None and final.usage.input_tokens_details.cached_tokens > 0
    assert standin.received[-1].json["previous_response_id"] == completed.response.id


def test_responses_reasoning_item_is_streamed_with_its_summary(
    standin: StandIn, client: openai.OpenAI
) -> None:
    with client.responses.stream(
        model="gpt-x",
        input="hi",
        reasoning={"effort": "low", "summary": "auto"},
        include=["reasoning.encrypted_content"],
    ) as stream:
        types = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.reasoning_summary_text.delta" in types
    reasoning, message = final.output
    assert reasoning.type == "reasoning"
    assert reasoning.summary[0].text == "The stand-in considers the turn."
    assert reasoning.encrypted_content
    assert message.type == "message"
    assert final.usage is not None and final.usage.output_tokens_details.reasoning_tokens > 0


def test_responses_errors_are_openai_shaped(standin: StandIn, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="gpt-x", input="hi", previous_response_id="resp_nope")
    assert info.value.code == "previous_response_not_found"
    assert info.value.param == "previous_response_id"
    assert info.value.message == (
        "Error code: 400 - {'error': {'message': \"Previous response with id 'resp_nope' not "
        "found.\", 'type': 'invalid_request_error', 'param': 'previous_response_id', "
        "'code': 'previous_response_not_found'}}"
    )
    with pytest.raises(openai.BadRequestError, match=re.escape("No tool call found")):
        client.responses.create(
            model="gpt-x",
            input=[{"type": "function_call_output", "call_id": "call_x", "output": ""}],
        )
    with pytest.raises(openai.RateLimitError):
        client.responses.create(
            model="gpt-x", input="hi", extra_body={"x_standin": {"status": 429}}
        )
    r = httpx.post(f"{standin.base_url}/responses", json={"model": "m", "input": "hi"})
    assert r.status_code == 401
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


# --- the official anthropic SDK, where installed -------------------------------------------


def test_anthropic_sdk_completes_a_tool_turn(standin: StandIn) -> None:
    anthropic = pytest.importorskip("anthropic")
    with anthropic.Anthropic(base_url=standin.root, api_key="sk-ant-test", max_retries=0) as sdk:
        tools = [READ]
        ask = [_user("read the readme")]
        first = sdk.messages.create(model="claude-x", max_tokens=512, messages=ask, tools=tools)
        assert first.stop_reason == "tool_use"
        use = first.content[-1]
        assert use.type == "tool_use" and use.input == {"file_path": "README.md"}

        turn = [
            *ask,
            {"role": "assistant", "content": first.content},
            _tool_result(use.model_dump(), "abc"),
        ]
        with sdk.messages.stream(
            model="claude-x",
            max_tokens=512,
            messages=turn,
            tools=tools,
            thinking={"type": "enabled", "budget_tokens": 1024},
        ) as stream:
            final = stream.get_final_message()
        assert final.stop_reason == "end_turn"
        assert [b.type for b in final.content] == ["thinking", "text"]
        assert final.content[0].signature
        assert final.content[1].text == "standin: done after tool Read; result had 3 chars"
        assert final.usage.input_tokens > 0

        with sdk.messages.stream(
            model="claude-x", max_tokens=512, messages=ask, tools=tools
        ) as stream:
            streamed = stream.get_final_message()
        assert streamed.content[-1].input == {"file_path": "README.md"}

        count = sdk.messages.count_tokens(model="claude-x", messages=ask)
        assert count.input_tokens == _prompt_tokens(standin.received[-1].json)


# --- the SDKs' own types, validated (their clients build models without validating) ---------


def test_responses_wire_validates_against_the_openai_types(standin: StandIn) -> None:
    events = TypeAdapter(ResponseStreamEvent)
    headers = {"authorization": "Bearer sk-test"}
    reasoning = {"effort": "low", "summary": "auto"}
    for extra in (
        {"tools": [SHELL]},
        {"reasoning": reasoning, "include": ["reasoning.encrypted_content"]},
    ):
        body = {"model": "gpt-x", "input": "hi", **extra}
        Response.model_validate(_post(standin, "/v1/responses", body, **headers).json())
        streamed = _post(standin, "/v1/responses", {**body, "stream": True}, **headers)
        for name, data in _sse(streamed.text):
            assert events.validate_python(data).type == name


def test_messages_wire_validates_against_the_anthropic_types(standin: StandIn) -> None:
    types = pytest.importorskip("anthropic.types")
    events = TypeAdapter(types.RawMessageStreamEvent)
    thinking = {"type": "enabled", "budget_tokens": 1024}
    for extra in ({"tools": [READ]}, {"thinking": thinking}):
        body = _messages(_user("hi"), **extra)
        types.Message.model_validate(_post(standin, "/v1/messages", body).json())
        streamed = _post(standin, "/v1/messages", {**body, "stream": True})
        for name, data in _sse(streamed.text):
            if name != "ping":  # documented, but not among the SDK's stream event types
                assert events.validate_python(data).type == name
    count = _post(standin, "/v1/messages/count_tokens", _messages(_user("hi")))
    types.MessageTokensCount.model_validate(count.json())


# --- bills, hand-computed: the providers' prompt caching, priced from litellm's map ------------
#
# Block sizes (o200k_base over each block's canonical JSON, as the stand-in counts them):
# SYSTEM 2,115 tokens; a user text block of "word " × n: n + 15; a chat message of "word " × n:
# n + 15. Prices per million tokens: claude-sonnet-4-5 input $3, 5-minute write $3.75,
# 1-hour write $6, read $0.30, output $15; gpt-4o input $2.50, read $1.25; gpt-5.1 input
# $1.25, read $0.125.

SYSTEM = "You are a careful coding agent. " * 300
FIVE = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}


def _text(n: int, marker: dict[str, str] | None = None) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": "word " * n}
    return {**block, "cache_control": marker} if marker else block


def _system(marker: dict[str, str] | None = FIVE) -> tuple[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": SYSTEM}
    return ("system", {**block, "cache_control": marker} if marker else block)


def _sonnet(usage: PromptUsage, output: int = 0) -> float:
    found = rates("claude-sonnet-4-5", "anthropic")
    assert found is not None
    return price(found, usage, output)


def test_hand_computed_sizes_and_prices_hold() -> None:
    assert tokens_of(canonical(*_system())) == 2115
    assert tokens_of(canonical("user", _text(485))) == 500
    assert tokens_of(canonical("message", {"role": "user", "content": "word " * 1485})) == 1500
    assert rates("claude-sonnet-4-5", "anthropic") == Rates(
        input=3e-6, output=15e-6, cache_read=0.3e-6, cache_write_5m=3.75e-6, cache_write_1h=6e-6
    )
    # litellm's map, not a rule of thumb: claude-opus-5-5 reads at 0.05× input
    assert rates("claude-opus-5-5", "anthropic") == Rates(
        input=4e-6, output=20e-6, cache_read=0.2e-6, cache_write_5m=5e-6, cache_write_1h=8e-6
    )
    gpt4o, gpt51 = rates("gpt-4o", "openai"), rates("gpt-5.1", "openai")
    assert gpt4o is not None and (gpt4o.input, gpt4o.cache_read) == (2.5e-6, 1.25e-6)
    assert gpt51 is not None and (gpt51.input, gpt51.cache_read) == (1.25e-6, 0.125e-6)


def test_anthropic_breakpoints_reads_refresh_and_expiry() -> None:
    clock = SimClock()
    cache = AnthropicCache(clock)
    a, b = ("user", _text(485, FIVE)), ("user", _text(85))  # 500 and 100 tokens

    # t=0: nothing cached: both breakpoints written for 5 minutes (2,115 + 500), B is input
    first = cache.bill("claude-sonnet-4-5", [_system(), a, b])
    assert first == PromptUsage(input=100, cache_write_5m=2615)
    assert _sonnet(first) == pytest.approx(2615 * 3.75e-6 + 100 * 3e-6)  # $0.01010625
    # t=4 min: the same prompt reads both prefixes, and the read keeps them 5 more minutes
    clock.advance(240)
    again = cache.bill("claude-sonnet-4-5", [_system(), a, b])
    assert again == PromptUsage(input=100, cache_read=2615)
    assert _sonnet(again) == pytest.approx(0.0010845)
    # t=8 min, 8 minutes after the write: still there (refreshed at 4); the marker moved to B
    clock.advance(240)
    moved = cache.bill(
        "claude-sonnet-4-5", [_system(), ("user", _text(485)), ("user", _text(85, FIVE))]
    )
    assert moved == PromptUsage(input=0, cache_read=2615, cache_write_5m=100)
    assert _sonnet(moved) == pytest.approx(2615 * 0.3e-6 + 100 * 3.75e-6)  # $0.0011595
    # 5 minutes and 1 second idle: everything expired, written again
    clock.advance(301)
    cold = cache.bill(
        "claude-sonnet-4-5", [_system(), ("user", _text(485)), ("user", _text(85, FIVE))]
    )
    assert cold == PromptUsage(input=0, cache_write_5m=2715)
    assert _sonnet(cold) == pytest.approx(0.01018125)


def test_anthropic_one_hour_breakpoint_outlives_the_five_minute_one() -> None:
    clock = SimClock()
    cache = AnthropicCache(clock)
    prompt = [_system(HOUR), ("user", _text(485, FIVE)), ("user", _text(85))]
    first = cache.bill("claude-sonnet-4-5", prompt)
    assert first == PromptUsage(input=100, cache_write_1h=2115, cache_write_5m=500)
    assert _sonnet(first) == pytest.approx(2115 * 6e-6 + 500 * 3.75e-6 + 100 * 3e-6)  # $0.014865
    clock.advance(30 * 60)  # the system prompt is read, the user turn written again
    later = cache.bill("claude-sonnet-4-5", prompt)
    assert later == PromptUsage(input=100, cache_read=2115, cache_write_5m=500)
    assert _sonnet(later) == pytest.approx(0.0028095)
    clock.advance(3601)
    assert cache.bill("claude-sonnet-4-5", prompt) == first


def test_anthropic_minimum_lookback_and_breakpoint_limit(standin: StandIn) -> None:
    cache = AnthropicCache(SimClock())
    prompt = [_system(), ("user", _text(485, FIVE)), ("user", _text(85))]
    # Opus 4.5 caches nothing shorter than 4,096 tokens: 2,715 tokens of plain input
    assert cache.bill("claude-opus-4-5", prompt) == PromptUsage(input=2715)
    # a breakpoint before 1,024 tokens caches nothing; its stretch is written with the next
    early = [("user", _text(485, FIVE)), _system(HOUR), ("user", _text(85))]
    assert cache.bill("claude-sonnet-4-5", early) == PromptUsage(input=100, cache_write_1h=2615)

    # the API checks 20 block boundaries for a hit: the breakpoint's and the 19 before it
    cache = AnthropicCache(SimClock())
    cache.bill("claude-sonnet-4-5", [_system()])
    turns = [("user", _text(85)) for _ in range(18)]
    near = [_system(None), *turns, ("user", _text(85, FIVE))]  # the system prompt 19 back
    assert cache.bill("claude-sonnet-4-5", near) == PromptUsage(
        input=0, cache_read=2115, cache_write_5m=1900
    )
    cache = AnthropicCache(SimClock())
    cache.bill("claude-sonnet-4-5", [_system()])
    far = [_system(None), *turns, ("user", _text(85)), ("user", _text(85, FIVE))]  # 20 back
    assert cache.bill("claude-sonnet-4-5", far) == PromptUsage(input=0, cache_write_5m=2115 + 2000)

    five = _messages(*[{"role": "user", "content": [_text(1, FIVE)]} for _ in range(5)])
    r = _post(standin, "/v1/messages", five)
    assert r.status_code == 400
    assert r.json()["error"] == {
        "type": "invalid_request_error",
        "message": "A maximum of 4 blocks with cache_control may be provided. Found 5.",
    }


def _chat(n: int) -> tuple[str, Any]:
    return ("message", {"role": "user", "content": "word " * (n - 15)})


def test_openai_caches_1024_tokens_then_128_token_steps() -> None:
    clock = SimClock()
    cache = OpenAICache(clock)
    small = cache.bill([_chat(1000)])
    assert cache.bill([_chat(1000)]) == small == PromptUsage(input=1000)  # under 1,024: never
    first = cache.bill([_chat(1500)])
    assert first == PromptUsage(input=1500)
    # the 1,500 tokens come again with 300 more: 1,408 = 1,024 + 3 × 128 of them are read
    longer = [_chat(1500), _chat(300)]
    second = cache.bill(longer)
    assert second == PromptUsage(input=392, cache_read=1408)
    gpt4o = rates("gpt-4o", "openai")
    assert gpt4o is not None
    assert price(gpt4o, second, 10) == pytest.approx(392 * 2.5e-6 + 1408 * 1.25e-6 + 10 * 10e-6)
    # the same prompt again: all but its last token, in steps: 1,792 of 1,800
    assert cache.bill(longer) == PromptUsage(input=8, cache_read=1792)
    # another prompt_cache_key routes elsewhere: nothing cached there
    assert cache.bill(longer, key="other") == PromptUsage(input=1800)
    # 5 minutes idle: gone (in_memory retention)
    clock.advance(300)
    assert cache.bill(longer) == PromptUsage(input=1800)


def test_openai_retention_in_memory_lasts_an_hour_at_most_24h_a_day() -> None:
    clock = SimClock()
    cache = OpenAICache(clock)
    prompt = [_chat(1500)]
    cache.bill(prompt)
    for _ in range(14):  # used every 4 minutes: kept, until an hour after it was written
        clock.advance(240)
        assert cache.bill(prompt).cache_read == 1408
    clock.advance(240)  # 60 minutes
    assert cache.bill(prompt).cache_read == 0

    cache.bill(prompt, key="s", retention="24h")
    clock.advance(2 * 3600)
    gpt51 = rates("gpt-5.1", "openai")
    assert gpt51 is not None
    warm = cache.bill(prompt, key="s", retention="24h")
    assert warm == PromptUsage(input=92, cache_read=1408)
    assert price(gpt51, warm, 0) == pytest.approx(92 * 1.25e-6 + 1408 * 0.125e-6)
    clock.advance(86_400)
    assert cache.bill(prompt, key="s", retention="24h").cache_read == 0


def test_bill_route_and_clock_route_price_each_answer(standin: StandIn) -> None:
    system = [{"type": "text", "text": SYSTEM, "cache_control": FIVE}]
    body = _messages({"role": "user", "content": [_text(85)]}, system=system)
    body["model"] = "claude-sonnet-4-5"
    first = _post(standin, "/v1/messages", body).json()["usage"]
    assert first["cache_creation"] == {
        "ephemeral_5m_input_tokens": 2115,
        "ephemeral_1h_input_tokens": 0,
    }
    assert (first["input_tokens"], first["cache_read_input_tokens"]) == (100, 0)
    assert httpx.post(f"{standin.root}/_standin/clock", json={"advance": 299}).json() == {
        "now": 299.0
    }
    second = _post(standin, "/v1/messages", body).json()["usage"]
    assert (second["cache_read_input_tokens"], second["cache_creation_input_tokens"]) == (2115, 0)
    standin.clock.advance(300)
    third = _post(standin, "/v1/messages", body).json()["usage"]
    assert third["cache_creation_input_tokens"] == 2115

    bill = httpx.get(f"{standin.root}/_standin/bill").json()
    assert bill == standin.bill()
    out = [u["output_tokens"] for u in (first, second, third)]
    usd = [
        2115 * 3.75e-6 + 100 * 3e-6 + out[0] * 15e-6,
        2115 * 0.3e-6 + 100 * 3e-6 + out[1] * 15e-6,
        2115 * 3.75e-6 + 100 * 3e-6 + out[2] * 15e-6,
    ]
    assert [line["usd"] for line in bill["lines"]] == pytest.approx(usd)
    assert [line["at"] for line in bill["lines"]] == [0.0, 299.0, 599.0]
    assert bill["usd"] == pytest.approx(sum(usd))
    assert bill["tokens"] == {
        "input": 300,
        "cache_read": 2115,
        "cache_write_5m": 4230,
        "cache_write_1h": 0,
        "output": sum(out),
    }
    bad = httpx.post(f"{standin.root}/_standin/clock", json={"advance": -1})
    assert bad.status_code == 400


# --- requests OpenClaw really sent (shared/fixtures), where present --------------------------


def _captures(folder: str) -> list[Any]:
    chat = fixture_dir()
    found = sorted((chat.parent / folder).glob("*-v1_*.json")) if chat else []
    return found or [pytest.param(None, marks=pytest.mark.skip(reason=f"no {folder} captures"))]


@pytest.mark.parametrize(
    "path", _captures("openclaw-messages"), ids=lambda p: getattr(p, "stem", p)
)
def test_openclaw_messages_captures_are_answered(standin: StandIn, path: Any) -> None:
    body = json.loads(path.read_bytes())
    r = _post(standin, "/v1/messages", body)
    assert r.status_code == 200, r.text
    events = _sse(r.text)
    text = "".join(d["delta"].get("text", "") for n, d in events if n == "content_block_delta")
    assert text.startswith("standin: done after tool ")
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"


@pytest.mark.parametrize(
    "path", _captures("openclaw-responses"), ids=lambda p: getattr(p, "stem", p)
)
def test_openclaw_responses_captures_are_answered(standin: StandIn, path: Any) -> None:
    body = json.loads(path.read_bytes())
    previous = body.get("previous_response_id")
    if previous:
        # the response this continuation follows, as the stand-in would have stored it
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
        standin.responses[previous] = StoredResponse([_user("earlier turns")], calls)
    r = _post(standin, "/v1/responses", body, authorization="Bearer sk-test")
    assert r.status_code == 200, r.text
    completed = _sse(r.text)[-1][1]
    assert completed["type"] == "response.completed"
    [message] = completed["response"]["output"]
    assert message["content"][0]["text"].startswith("standin: done after tool memory_")


def _steps(tokens: int) -> int:
    """The most of `tokens` OpenAI's cache holds: 1,024 + 128·k, or nothing below 1,024."""
    return 0 if tokens < 1024 else tokens // 128 * 128


def _prompt_tokens(body: dict[str, Any]) -> int:
    """A Messages prompt's tokens, counted here: the stand-in's tokenizer over each block's
    canonical JSON (without its cache marker): tools, then system blocks, then content blocks."""
    blocks: list[tuple[str, Any]] = [("tool", t) for t in body.get("tools") or []]
    system = body.get("system")
    blocks += [("system", b) for b in system] if isinstance(system, list) else []
    blocks += [("system", system)] if isinstance(system, str) else []
    for m in body["messages"]:
        content = m["content"]
        parts = content if isinstance(content, list) else [content]
        blocks += [(m["role"], part) for part in parts]
    total = 0
    for kind, block in blocks:
        if isinstance(block, dict):
            block = {k: v for k, v in block.items() if k != "cache_control"}
        total += tokens_of(json.dumps([kind, block], sort_keys=True, ensure_ascii=False))
    return total


def test_a_planner_chooses_the_answer_in_every_format(standin: StandIn) -> None:
    seen: list[tuple[str, int]] = []
    turn = PlannedTurn("Reading it.", ("read", {"path": "a.py"}))

    def planner(wire: str, data: dict[str, Any], conversation: list[Any]) -> PlannedTurn:
        seen.append((wire, len(conversation)))
        return turn

    standin.planner = planner
    function = {"name": "read", "parameters": {"type": "object"}}
    ask = {"role": "user", "content": "read a.py"}
    chat = {
        "model": "gpt-4.1",
        "messages": [ask],
        "tools": [{"type": "function", "function": function}],
    }
    headers = {"authorization": "Bearer sk-test"}
    message = _post(standin, "/v1/chat/completions", chat, **headers).json()["choices"][0][
        "message"
    ]
    assert message["content"] == "Reading it."
    [call] = message["tool_calls"]
    assert call["function"] == {"name": "read", "arguments": '{"path": "a.py"}'}
    streamed = _post(standin, "/v1/chat/completions", {**chat, "stream": True}, **headers).text
    deltas = [
        json.loads(line[6:])["choices"][0]["delta"]
        for line in streamed.splitlines()
        if line.startswith("data: {")
    ]
    assert "".join(d.get("content") or "" for d in deltas) == "Reading it."
    parts = [c for d in deltas for c in d.get("tool_calls") or []]
    assert parts[0]["function"]["name"] == "read"
    assert "".join(p["function"]["arguments"] for p in parts) == '{"path": "a.py"}'

    blocks = _post(standin, "/v1/messages", _messages(_user("read a.py"))).json()["content"]
    assert [b["type"] for b in blocks] == ["text", "tool_use"]
    assert (blocks[1]["name"], blocks[1]["input"]) == ("read", {"path": "a.py"})
    turn = PlannedTurn("All done.")
    body = {"model": "gpt-5.5", "input": "read a.py"}
    [item] = _post(standin, "/v1/responses", body, **headers).json()["output"]
    assert item["content"][0]["text"] == "All done."
    assert seen == [("chat", 1), ("chat", 1), ("messages", 1), ("responses", 1)]
