"""The OpenAI Responses wire adapter: segments in `instructions`, system/developer items and
`function_call_output`s; continuation (`previous_response_id`) with call names remembered
from relayed replies; unknown items untouched; bad input; the proxy's own replies."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import openai
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxbudget.caps import Caps, ToolNames, clamp_request
from ctxbudget.proxy.errors import BadRequest, UpstreamError
from ctxbudget.proxy.wire import CallNames, OpenAIResponses
from tests.inproc import settings as proxy_settings
from tests.openclaw import (
    INTERNAL_CONTEXT,
    format_fixtures,
    memory_get_result,
    memory_search_result,
    system_prompt,
    web_fetch_result,
)

CAPS = Caps(bootstrap_max_chars=8000, memory_max_chars=2500, web_fetch_max_chars=8000)
CAPTURES = format_fixtures("openclaw-responses")
PAGE = "A paragraph of a long fetched page. " * 900
REASONING = {
    "type": "reasoning",
    "summary": [{"type": "summary_text", "text": "thinking"}],
    "encrypted_content": "gAAAAB" + "x" * 400,
}


def call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    arguments = json.dumps(args, separators=(",", ":"))
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}


def output(call_id: str, text: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def request(*, role: str = "system") -> dict[str, Any]:
    """A Responses request as OpenClaw 2026.9.6 sends it (`OPENCLAW_WIRE_FORMATS.md` §4)."""
    return {
        "model": "gpt-x",
        "input": [
            {
                "type": "message",
                "role": role,
                "content": [{"type": "input_text", "text": system_prompt()}],
            },
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "[Sun 2026-11-22 20:55 UTC] Fetch it"}],
            },
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": INTERNAL_CONTEXT}],
            },
            REASONING,
            call("call_a", "web_fetch", {"url": "https://example.com/page"}),
            output("call_a", web_fetch_result(content=PAGE)),
            call("call_b", "tool_call", {"id": "memory_search", "args": {"query": "x"}}),
            output("call_b", memory_search_result(snippets=["s " * 900] * 4)),
            call("call_c", "memory_get", {"path": "M.md"}),
            output("call_c", memory_get_result(text="line of memory\n" * 600)),
            {"type": "custom_tool_call", "call_id": "call_d", "name": "apply_patch", "input": PAGE},
        ],
        "stream": True,
        "max_output_tokens": 4096,
        "tools": [{"type": "function", "name": "web_fetch", "parameters": {"type": "object"}}],
        "store": False,
        "reasoning": {"effort": "low", "summary": "auto"},
        "include": ["reasoning.encrypted_content"],
    }


def clamped(
    raw: bytes, *, apply: bool = True, wire: OpenAIResponses | None = None, owner: str = "default"
) -> tuple[bytes, list[Any], Any]:
    parsed = (wire or OpenAIResponses()).parse(raw, owner=owner)
    segments = parsed.clamp(clamp_request, CAPS, ToolNames(), apply=apply)
    return parsed.encode(), segments, parsed


def untouched(body: dict[str, Any]) -> list[Any]:
    """Items a clamp must never change: reasoning, calls, unknown types."""
    return [i for i in body["input"] if i.get("type") not in ("message", "function_call_output")]


@pytest.mark.parametrize("role", ["system", "developer"])
def test_every_segment_is_found_and_clamped_within_its_cap(role: str) -> None:
    body = request(role=role)
    out, segments, _ = clamped(orjson.dumps(body))
    kinds = {(s.kind, s.tool) for s in segments if s.action == "clamped"}
    assert kinds == {
        ("bootstrap", None),
        ("web_fetch", "web_fetch"),
        ("memory", "memory_search"),
        ("memory", "memory_get"),
    }
    assert all(s.after <= s.cap for s in segments if s.action == "clamped" and s.cap is not None)
    sent = orjson.loads(out)
    assert untouched(sent) == untouched(body)
    assert [set(i) for i in sent["input"]] == [set(i) for i in body["input"]]
    assert {k: v for k, v in sent.items() if k != "input"} == {
        k: v for k, v in body.items() if k != "input"
    }


def test_instructions_hold_bootstrap_files_too() -> None:
    body = {"model": "gpt-x", "instructions": system_prompt(), "input": "hello"}
    out, segments, _ = clamped(orjson.dumps(body))
    assert [s.kind for s in segments if s.action == "clamped"] == ["bootstrap"]
    assert len(orjson.loads(out)["instructions"]) < len(body["instructions"])


def test_clamping_is_deterministic_idempotent_and_byte_identical_when_off() -> None:
    raw = orjson.dumps(request())
    once, _, _ = clamped(raw)
    assert clamped(raw)[0] == once and clamped(once)[0] == once
    spaced = json.dumps(request(), indent=1).encode()
    assert clamped(spaced, apply=False)[0] == spaced


def test_a_continuation_result_is_named_from_the_reply_that_called_it() -> None:
    wire = OpenAIResponses()
    # the earlier reply, relayed as SSE in awkward chunks: it called web_fetch
    item = call("call_x", "web_fetch", {"url": "https://example.com/page"})
    events = [
        {"type": "response.created", "response": {"id": "resp_1", "output": []}},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**item, "arguments": ""},
        },
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": {"id": "resp_1", "output": [item]}},
    ]
    stream = b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events
    )
    first = wire.parse(orjson.dumps({"model": "m", "input": "go", "stream": True}), owner="alice")
    watcher = wire.watch_reply(first, "alice")
    for i in range(0, len(stream), 7):
        watcher.feed(stream[i : i + 7])
    watcher.close()
    # the next request carries only the output: its call is stored upstream
    page = "Plain page text that is not JSON at all. " * 600
    later = orjson.dumps(
        {
            "model": "m",
            "previous_response_id": "resp_1",
            "input": [output("call_x", web_fetch_result(content=page))],
        }
    )
    _, segments, parsed = clamped(later, wire=wire, owner="alice")
    (segment,) = segments
    assert segment.kind == "web_fetch" and segment.tool == "web_fetch"
    assert segment.note is not None and "earlier reply" in segment.note
    assert parsed.note is not None and "resp_1" in parsed.note
    # another owner's request with the same call id learns nothing from alice's replies
    assert wire.names.get("bob", "call_x") is None
    assert wire.names.get("alice", "call_x") == ("web_fetch", item["arguments"])


def test_a_json_reply_is_read_for_calls_too_and_the_memory_is_bounded() -> None:
    names = CallNames(limit=3)
    wire = OpenAIResponses(names)
    parsed = wire.parse(b'{"model": "m", "input": "go"}')
    watcher = wire.watch_reply(parsed, "default")
    reply = {"id": "resp_2", "output": [call(f"c{i}", "memory_get", {}) for i in range(5)]}
    watcher.feed(orjson.dumps(reply))
    watcher.close()
    assert len(names) == 3
    assert names.get("default", "c0") is None and names.get("default", "c4") is not None


def test_the_call_names_are_bounded_in_bytes_whatever_the_arguments_size() -> None:
    """An upstream's reply names calls with arguments of any size: 10,000 of them kept by
    count alone could hold gigabytes. They are weighed, and the oldest go."""
    names = CallNames(max_bytes=4 << 20)
    wire = OpenAIResponses(names)
    watcher = wire.watch_reply(wire.parse(b'{"model": "m", "input": "go"}'), "default")
    big = {"text": "x" * (1 << 20)}
    reply = {"id": "resp_3", "output": [call(f"c{i}", "memory_get", big) for i in range(12)]}
    watcher.feed(orjson.dumps(reply))
    watcher.close()
    assert 1 <= len(names) <= 4  # ~1 MB each in a 4 MB bound
    assert names.get("default", "c11") is not None and names.get("default", "c0") is None


def test_memories_go_to_the_last_user_message() -> None:
    body = request()
    parsed = OpenAIResponses().parse(orjson.dumps(body))
    parsed.inject(["- Preference: tea"], "user")
    sent = orjson.loads(parsed.encode())
    assert sent["input"][:2] == body["input"][:2] and sent["input"][3:] == body["input"][3:]
    assert sent["input"][2]["content"][-1] == {
        "type": "input_text",
        "text": "User context:\n- Preference: tea",
    }
    plain = OpenAIResponses().parse(b'{"model": "m", "input": "hi"}')
    plain.inject(["- a"], "user")
    assert orjson.loads(plain.encode())["input"] == "hi\n\nUser context:\n- a"
    system = OpenAIResponses().parse(b'{"model": "m", "input": "hi"}')
    system.inject(["- a"], "system")
    assert orjson.loads(system.encode())["instructions"] == "User context:\n- a"


def test_the_user_turn() -> None:
    parsed = OpenAIResponses().parse(orjson.dumps(request()))
    turn = parsed.user_turn()
    assert turn is not None and turn.index == 1 and turn.query == "Fetch it" and not turn.last
    simple = OpenAIResponses().parse(b'{"model": "m", "input": "/context budget"}').user_turn()
    assert simple is not None and simple.last and simple.query == "/context budget"
    easy = OpenAIResponses().parse(
        b'{"model": "m", "input": [{"role": "user", "content": "/ctxbudget json"}]}'
    )
    found = easy.user_turn()
    assert found is not None and found.last and found.query == "/ctxbudget json"


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        ({"input": 5}, "'input' must be a string or a list of items, got integer", "input"),
        ({"input": None}, "'input' must be a string or a list of items, got null", "input"),
        ({"input": ["x"]}, "'input[0]' must be an object, got string", "input[0]"),
        (
            {"input": [{"role": "user", "content": 3}]},
            "'input[0].content' must be a string or a list",
            "input[0].content",
        ),
        (
            {"input": [{"type": "function_call_output", "output": "x"}]},
            "'input[0].call_id' must be a string",
            "input[0].call_id",
        ),
        (
            {"input": [output("c9", "x")]},
            "call_id 'c9', which no earlier function_call",
            "input[0].call_id",
        ),
        ({"input": "x", "instructions": ["a"]}, "'instructions' must be a string", "instructions"),
        ({"input": "x", "model": 1}, "'model' must be a string", "model"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    body: dict[str, Any], message: str, param: str
) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)) as caught:
        OpenAIResponses().parse(orjson.dumps(body))
    assert caught.value.param == param
    assert OpenAIResponses().error_body(caught.value)["error"]["param"] == param


def test_a_continuation_may_answer_a_call_it_does_not_carry() -> None:
    raw = orjson.dumps(
        {"model": "m", "previous_response_id": "resp_1", "input": [output("c9", "x")]}
    )
    assert OpenAIResponses().parse(raw).continues == "resp_1"


def test_upstream_target_credentials_and_stream_error() -> None:
    plain = proxy_settings(upstream={"baseUrl": "http://up/v1", "apiKeyEnv": None})
    wire = OpenAIResponses()
    assert wire.upstream_url(plain, "/v1/responses", "") == "http://up/v1/responses"
    sent = wire.upstream_headers({"authorization": "Bearer c", "accept-encoding": "gzip"}, plain)
    assert sent["authorization"] == "Bearer c" and sent["accept-encoding"] == "identity"
    event = wire.stream_error(UpstreamError("broke"))
    assert event.startswith(b"event: error\ndata: ")
    assert orjson.loads(event.split(b"data: ", 1)[1])["message"] == "broke"


def test_the_command_reply_is_a_response_the_sdk_reads_in_json_and_sse() -> None:
    wire = OpenAIResponses()
    reply = wire.command_reply(
        "report", wire.parse(b'{"model": "m", "input": "x"}'), request_id="cb-1"
    )
    assert isinstance(reply.body, bytes)
    response = openai.types.responses.Response.model_validate_json(reply.body)
    assert response.output_text == "report"
    text = "y" * 1000
    sse = wire.command_reply(
        text, wire.parse(b'{"model": "m", "input": "x", "stream": true}'), request_id="cb-2"
    )
    assert not isinstance(sse.body, bytes)

    async def collect() -> bytes:
        return b"".join([chunk async for chunk in sse.body])  # type: ignore[union-attr]

    events = [
        json.loads(e.split("data: ", 1)[1])
        for e in asyncio.run(collect()).decode().split("\n\n")
        if e
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == text
    done = openai.types.responses.Response.model_validate(events[-1]["response"])
    assert done.output_text == text


@pytest.mark.skipif(not CAPTURES, reason="shared OpenClaw Responses captures not present")
@pytest.mark.parametrize(("name", "raw"), CAPTURES, ids=[n for n, _ in CAPTURES])
def test_openclaw_captures_clamp_within_caps_and_keep_everything_else(
    name: str, raw: bytes
) -> None:
    body = orjson.loads(raw)
    out, segments, parsed = clamped(raw)
    sent = orjson.loads(out)
    assert untouched(sent) == untouched(body)
    assert {k: v for k, v in sent.items() if k != "input"} == {
        k: v for k, v in body.items() if k != "input"
    }
    assert any(s.action == "clamped" for s in segments)
    assert all(s.after <= s.cap for s in segments if s.action == "clamped" and s.cap is not None)
    assert clamped(out)[0] == out
    assert clamped(raw, apply=False)[0] == raw
    assert (parsed.note is not None) == ("previous_response_id" in body)


@settings(max_examples=40, deadline=None)
@given(
    page_chars=st.integers(0, 30_000),
    snippets=st.lists(st.integers(0, 3000), max_size=5),
    as_parts=st.booleans(),
)
def test_property_reasoning_calls_and_unknown_items_survive_any_clamp(
    page_chars: int, snippets: list[int], as_parts: bool
) -> None:
    body = request()
    page = web_fetch_result(content=("word " * (page_chars // 5 + 1))[:page_chars])
    body["input"][5]["output"] = [{"type": "input_text", "text": page}] if as_parts else page
    body["input"][7]["output"] = memory_search_result(snippets=["s" * n for n in snippets])
    raw = orjson.dumps(body)
    out, segments, _ = clamped(raw)
    sent = orjson.loads(out)
    assert untouched(sent) == untouched(body)
    assert [set(i) for i in sent["input"]] == [set(i) for i in body["input"]]
    assert clamped(raw)[0] == out and clamped(out)[0] == out
    assert all(s.after <= s.cap for s in segments if s.action == "clamped" and s.cap is not None)


# -- Codex (issue 21) ------------------------------------------------------------------------


def test_codexs_agents_md_is_clamped_and_exec_output_capped() -> None:
    from tests.agents import LOG, codex_request, exec_output

    body = codex_request(
        outputs=[
            ("exec_command", {"cmd": "cat note.txt"}, exec_output("The secret word.\n")),
            ("exec_command", {"cmd": "pytest"}, exec_output(LOG)),
            ("apply_patch", {"input": "*** Begin Patch"}, exec_output(LOG)),
        ]
    )
    caps = Caps(bootstrap_max_chars=8000, tool_output_max_chars=16000)
    parsed = OpenAIResponses().parse(orjson.dumps(body))
    segments = parsed.clamp(clamp_request, caps, ToolNames(), apply=True)
    sent = orjson.loads(parsed.encode())
    assert [(s.kind, s.label, s.action, s.message_index) for s in segments] == [
        ("bootstrap", "/w/AGENTS.md", "clamped", 1),
        ("tool_output", "exec_command call_01abcdef", "clamped", 8),
    ]
    agents, environment = sent["input"][1]["content"]
    assert agents["text"].startswith("# AGENTS.md instructions for /w\n\n<INSTRUCTIONS>\n")
    assert agents["text"].endswith("\n</INSTRUCTIONS>") and len(agents["text"]) < 8100
    assert environment == body["input"][1]["content"][1]
    assert sent["input"][2] == body["input"][2]  # the user's own prompt
    assert sent["input"][5] == body["input"][5]  # a short output
    assert sent["input"][11] == body["input"][11]  # apply_patch: never cut
    assert len(sent["input"][8]["output"]) <= 16000
    assert [i for i in sent["input"] if i["type"] == "reasoning"] == [
        i for i in body["input"] if i["type"] == "reasoning"
    ]


def _grown(turns: int, **more: Any) -> bytes:
    """A Responses conversation after `turns` tool turns (each a call and its output)."""
    items: list[Any] = [{"type": "message", "role": "user", "content": "go " + "x" * 9000}]
    for n in range(turns):
        items += [call(f"c{n}", "exec", {"command": f"ls {n}"}), output(f"c{n}", f"out {n}")]
    return orjson.dumps({"model": "m", **more, "input": items})


def test_a_grown_conversation_has_only_its_new_items_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Request N+1 is request N and a turn: the items request N passed are not checked
    again, however many; a request that continues a response (an output may answer a call
    it does not carry) is no check for one that does not."""
    from ctxbudget.proxy.wire import responses
    from ctxbudget.proxy.wire.conversations import Conversations

    checked: list[int] = []
    real = responses._check_items

    def counted(items: list[Any], *rest: Any, **kw: Any) -> Any:
        checked.append(len(items) - (rest[0] if rest else 0))
        return real(items, *rest, **kw)

    monkeypatch.setattr(responses, "_check_items", counted)
    kept, wire = Conversations(), OpenAIResponses()
    for turns in range(200, 204):
        wire.parse(_grown(turns), owner="o", conversations=kept)
    assert checked[0] == 401 and checked[1:] == [2, 2, 2], checked
    # an output answering no call passes in a continuation; resumed from there, a request
    # that is not one has it checked again, and refused
    orphan = orjson.loads(_grown(205, previous_response_id="resp_1"))
    orphan["input"].insert(3, output("nobody", "x"))
    wire.parse(orjson.dumps(orphan), owner="o", conversations=kept)
    orphan.pop("previous_response_id")
    orphan["input"] += [call("c999", "exec", {}), output("c999", "y")]
    with pytest.raises(BadRequest, match="no earlier function_call"):
        wire.parse(orjson.dumps(orphan), owner="o", conversations=kept)
