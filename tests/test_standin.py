"""The stand-in upstream speaks the wire the official SDKs parse: Anthropic Messages (JSON, SSE,
count_tokens) and OpenAI Responses (JSON, SSE, previous_response_id), with a scripted tool turn.

The `anthropic` SDK tests skip where that package is not installed; the same wire is checked
with httpx here in any case. The captured OpenClaw requests (`shared/fixtures`) are answered
too, where present.
"""

from __future__ import annotations

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
from tests.standin import StandIn, StoredResponse, run_standin, tokens_of

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
    first = client.responses.create(model="gpt-x", input=prompt, tools=tools, store=False)
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
    second = client.responses.create(model="gpt-x", input=history, tools=tools, store=False)
    assert second.output_text == "standin: done after tool shell; result had 4 chars"
    assert second.usage is not None
    assert second.usage.input_tokens_details.cached_tokens > 0  # the first prompt is a prefix


def test_responses_stream_events_and_continuation(standin: StandIn, client: openai.OpenAI) -> None:
    tools: Any = [SHELL]
    stream = client.responses.create(model="gpt-x", input="list files", tools=tools, stream=True)
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
        model="gpt-x", input=output, tools=tools, previous_response_id=completed.response.id
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
