"""The Anthropic Messages wire adapter: where the segments are, what a clamp may change (only
the capped texts: never a block, a `cache_control` marker or a thinking block), injection,
bad input, and the proxy's own replies. Replays the shared OpenClaw captures when present."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import anthropic
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxbudget.caps import Caps, ToolNames, clamp_request
from ctxbudget.proxy.errors import BadRequest, UpstreamError
from ctxbudget.proxy.wire import AnthropicMessages
from tests.inproc import settings as proxy_settings
from tests.openclaw import (
    INTERNAL_CONTEXT,
    format_fixtures,
    memory_get_result,
    memory_search_result,
    system_prompt,
    web_fetch_result,
)

MESSAGES = AnthropicMessages()
CAPS = Caps(bootstrap_max_chars=8000, memory_max_chars=2500, web_fetch_max_chars=8000)
CAPTURES = format_fixtures("openclaw-messages")
PAGE = "A paragraph of a long fetched page. " * 900
EPHEMERAL = {"type": "ephemeral"}


def request(*, thinking: bool = True, bridge: bool = False) -> dict[str, Any]:
    """A Messages request as OpenClaw 2026.9.6 sends it (`OPENCLAW_WIRE_FORMATS.md` §3)."""
    prompt = system_prompt()
    stable, dynamic = (
        prompt.split("## Silent Replies", 1)
        if "## Silent Replies" in prompt
        else (
            prompt,
            "",
        )
    )
    fetch = {"url": "https://example.com/page"}
    call = (
        {
            "type": "tool_use",
            "id": "toolu01a",
            "name": "tool_call",
            "input": {"id": "web_fetch", "args": fetch},
        }
        if bridge
        else {"type": "tool_use", "id": "toolu01a", "name": "web_fetch", "input": fetch}
    )
    assistant: list[dict[str, Any]] = [
        {"type": "text", "text": "Fetching."},
        call,
        {"type": "tool_use", "id": "toolu01b", "name": "memory_search", "input": {"query": "x"}},
        {"type": "tool_use", "id": "toolu01c", "name": "memory_get", "input": {"path": "M.md"}},
    ]
    if thinking:
        assistant.insert(
            0, {"type": "thinking", "thinking": "Let me fetch " * 50, "signature": "EqQBsig=="}
        )
    return {
        "model": "claude-sonnet-4-5",
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "[Sun 2026-11-22 20:55 UTC] Fetch it",
                        "cache_control": EPHEMERAL,
                    }
                ],
            },
            {"role": "assistant", "content": assistant},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu01a",
                        "content": web_fetch_result(content=PAGE),
                        "is_error": False,
                    },
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu01b",
                        "content": [
                            {
                                "type": "text",
                                "text": memory_search_result(snippets=["s " * 900] * 4),
                            }
                        ],
                        "is_error": False,
                    },
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu01c",
                        "content": memory_get_result(text="line of memory\n" * 600),
                        "is_error": False,
                        "cache_control": EPHEMERAL,
                    },
                ],
            },
            {"role": "user", "content": [{"type": "text", "text": INTERNAL_CONTEXT + "\nctx"}]},
        ],
        "max_tokens": 4096,
        "stream": True,
        "system": [
            {"type": "text", "text": stable, "cache_control": EPHEMERAL},
            {"type": "text", "text": "## Silent Replies" + dynamic},
        ],
        "tools": [
            {"name": "web_fetch", "input_schema": {"type": "object"}, "cache_control": EPHEMERAL}
        ],
        "thinking": {"type": "enabled", "budget_tokens": 2048},
    }


def clamped(raw: bytes, *, apply: bool = True) -> tuple[bytes, list[Any]]:
    parsed = MESSAGES.parse(raw)
    segments = parsed.clamp(clamp_request, CAPS, ToolNames(), apply=apply)
    return parsed.encode(), segments


def skeleton(value: Any) -> Any:
    """Everything but the texts a cap may shorten: block types, keys, markers, ids, thinking."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in ("text", "content") and (isinstance(item, str)):
                out[key] = "<text>"
            else:
                out[key] = skeleton(item)
        return out
    if isinstance(value, list):
        return [skeleton(v) for v in value]
    return value


def markers(body: dict[str, Any]) -> list[str]:
    """Where every cache_control marker sits, as paths."""
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
    return found


def thinking_blocks(body: dict[str, Any]) -> list[Any]:
    return [
        b
        for m in body["messages"]
        if isinstance(m.get("content"), list)
        for b in m["content"]
        if b.get("type") in ("thinking", "redacted_thinking")
    ]


@pytest.mark.parametrize("bridge", [False, True], ids=["direct", "tool-search"])
def test_every_segment_is_found_and_clamped_within_its_cap(bridge: bool) -> None:
    raw = orjson.dumps(request(bridge=bridge))
    out, segments = clamped(raw)
    kinds = {(s.kind, s.tool) for s in segments if s.action == "clamped"}
    assert ("bootstrap", None) in kinds
    assert ("web_fetch", "web_fetch") in kinds
    assert ("memory", "memory_search") in kinds and ("memory", "memory_get") in kinds
    assert all(s.after <= s.cap for s in segments if s.action == "clamped" and s.cap is not None)
    sent = orjson.loads(out)
    assert len(sent["system"][0]["text"]) < len(request()["system"][0]["text"])
    # each result was clamped where it was: index of its message in `messages`
    assert {s.message_index for s in segments if s.kind != "bootstrap"} == {2}
    assert {s.message_index for s in segments if s.kind == "bootstrap"} == {-1}


def test_a_clamp_changes_only_capped_texts_never_blocks_markers_or_thinking() -> None:
    body = request()
    out, _ = clamped(orjson.dumps(body))
    sent = orjson.loads(out)
    assert skeleton(sent) == skeleton(body)
    assert markers(sent) == markers(body)
    assert len(markers(sent)) == 4
    assert thinking_blocks(sent) == thinking_blocks(body)
    assert sent["tools"] == body["tools"]


def test_clamping_is_deterministic_and_idempotent() -> None:
    raw = orjson.dumps(request())
    once, _ = clamped(raw)
    assert clamped(raw)[0] == once
    again, segments = clamped(once)
    assert again == once
    assert all(s.action == "kept" or s.saved == 0 for s in segments)


def test_budget_off_forwards_the_clients_bytes_and_reports_would_clamp() -> None:
    raw = json.dumps(request(), indent=1).encode()  # any spacing: it is kept
    out, segments = clamped(raw, apply=False)
    assert out == raw
    assert sum(s.saved for s in segments) > 0


def test_a_system_string_and_claude_codes_system_message_are_read_for_bootstrap_files() -> None:
    body = request()
    body["system"] = system_prompt()
    body["messages"].insert(
        0,
        {
            "role": "system",
            "content": [{"type": "text", "text": system_prompt(), "cache_control": EPHEMERAL}],
        },
    )
    body["messages"][1]["content"][0].pop("cache_control")
    out, segments = clamped(orjson.dumps(body))
    sent = orjson.loads(out)
    assert isinstance(sent["system"], str) and len(sent["system"]) < len(body["system"])
    assert sent["messages"][0]["content"][0]["cache_control"] == EPHEMERAL
    assert len(sent["messages"][0]["content"][0]["text"]) < len(
        body["messages"][0]["content"][0]["text"]
    )
    assert {s.message_index for s in segments if s.kind == "bootstrap"} == {-1, 0}


def test_images_documents_and_server_tools_pass_untouched() -> None:
    body = request()
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR" * 100},
    }
    body["messages"][2]["content"][0]["content"] = [
        image,
        {"type": "text", "text": web_fetch_result(content=PAGE)},
    ]
    body["messages"][1]["content"].append(
        {
            "type": "server_tool_use",
            "id": "srvtoolu_1",
            "name": "web_search",
            "input": {"query": "q"},
        }
    )
    body["messages"][0]["content"].append(
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": PAGE}}
    )
    out, _ = clamped(orjson.dumps(body))
    sent = orjson.loads(out)
    assert sent["messages"][2]["content"][0]["content"][0] == image
    assert sent["messages"][1]["content"][-1] == body["messages"][1]["content"][-1]
    assert sent["messages"][0]["content"][-1] == body["messages"][0]["content"][-1]
    assert len(sent["messages"][2]["content"][0]["content"][1]["text"]) < len(PAGE)


def test_memories_are_appended_to_the_last_user_message_keeping_the_cached_prefix() -> None:
    body = request()
    parsed = MESSAGES.parse(orjson.dumps(body))
    parsed.inject(["- Preference: tea (today, you told me)"], "user")
    sent = orjson.loads(parsed.encode())
    assert sent["messages"][:-1] == body["messages"][:-1]
    assert sent["system"] == body["system"]
    last = sent["messages"][-1]["content"]
    assert last[:-1] == body["messages"][-1]["content"]
    assert last[-1] == {
        "type": "text",
        "text": "User context:\n- Preference: tea (today, you told me)",
    }
    placed = MESSAGES.parse(orjson.dumps(body))
    placed.inject(["- a"], "system")
    assert orjson.loads(placed.encode())["system"][:2] == body["system"]


def test_the_user_turn_and_the_system_text() -> None:
    parsed = MESSAGES.parse(orjson.dumps(request()))
    turn = parsed.user_turn()
    assert turn is not None and turn.index == 0 and turn.query == "Fetch it" and not turn.last
    assert "# Project Context" in parsed.system_text()
    own = MESSAGES.parse(
        orjson.dumps(
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": "/context budget"},
                    {"role": "user", "content": [{"type": "text", "text": INTERNAL_CONTEXT}]},
                ],
            }
        )
    ).user_turn()
    assert own is not None and own.last and own.query == "/context budget"


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        ({"model": "m"}, "'messages' is required", "messages"),
        (
            {"messages": {"role": "user"}},
            "'messages' must be a list of messages, got object",
            "messages",
        ),
        (
            {"messages": [], "system": 3},
            "'system' must be a string or a list of text blocks, got integer",
            "system",
        ),
        ({"messages": [], "system": ["x"]}, "'system' must be a string or a list", "system"),
        ({"messages": ["hi"]}, "'messages[0]' must be an object, got string", "messages[0]"),
        (
            {"messages": [{"role": "user", "content": 5}]},
            "'messages[0].content' must be a string or a list",
            "messages[0].content",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "x"}],
                    }
                ]
            },
            "tool_use_id 't9', which no earlier tool_use",
            "messages[0].content[0].tool_use_id",
        ),
        ({"messages": [], "model": 4}, "'model' must be a string", "model"),
        ({"messages": [], "stream": "yes"}, "'stream' must be true or false", "stream"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    body: dict[str, Any], message: str, param: str
) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)) as caught:
        MESSAGES.parse(orjson.dumps(body))
    assert caught.value.param == param
    shaped = MESSAGES.error_body(caught.value)
    assert shaped["type"] == "error" and shaped["error"]["type"] == "invalid_request_error"


def test_errors_keep_the_upstreams_own_body_and_stream_as_an_error_event() -> None:
    theirs = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    assert MESSAGES.error_body(UpstreamError("Overloaded", status=529, body=theirs)) == theirs
    ours = MESSAGES.error_body(UpstreamError("upstream down", status=502))
    assert ours == {"type": "error", "error": {"type": "api_error", "message": "upstream down"}}
    event = MESSAGES.stream_error(UpstreamError("broke"))
    assert event.startswith(b"event: error\ndata: ") and event.endswith(b"\n\n")
    assert orjson.loads(event.split(b"data: ", 1)[1])["error"]["message"] == "broke"


def test_upstream_target_and_credentials() -> None:
    plain = proxy_settings(anthropic={"baseUrl": "http://a.test", "apiKeyEnv": "AK"})
    assert (
        MESSAGES.upstream_url(plain, "/v1/messages", "beta=true")
        == "http://a.test/v1/messages?beta=true"
    )
    assert AnthropicMessages(counting=True).upstream_url(
        plain, "/v1/messages/count_tokens", ""
    ) == ("http://a.test/v1/messages/count_tokens")
    v1 = proxy_settings(anthropic={"baseUrl": "http://a.test/v1/"})
    assert MESSAGES.upstream_url(v1, "/messages", "") == "http://a.test/v1/messages"
    client = {
        "x-api-key": "sk-client",
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "b1,b2",
    }
    sent = MESSAGES.upstream_headers(client, plain)
    assert sent["x-api-key"] == "sk-client" and sent["anthropic-beta"] == "b1,b2"
    keyed = proxy_settings(env={"AK": "sk-ours", "KEYS": "pk"}, anthropic={"apiKeyEnv": "AK"})
    assert MESSAGES.upstream_headers({**client, "x-api-key": "pk"}, keyed)["x-api-key"] == "sk-ours"
    locked = proxy_settings(env={"KEYS": "pk"})
    sent = MESSAGES.upstream_headers({"x-api-key": "pk", "authorization": "Bearer pk"}, locked)
    assert "x-api-key" not in sent and "authorization" not in sent
    oauth = MESSAGES.upstream_headers({"authorization": "Bearer sk-ant-oat01"}, plain)
    assert oauth["authorization"] == "Bearer sk-ant-oat01"


def test_the_command_reply_is_a_message_the_sdk_reads_in_json_and_sse() -> None:
    parsed = MESSAGES.parse(b'{"model":"claude-x","messages":[{"role":"user","content":"hi"}]}')
    reply = MESSAGES.command_reply("report text", parsed, request_id="cb-1")
    assert isinstance(reply.body, bytes)
    message = anthropic.types.Message.model_validate_json(reply.body)
    assert message.content[0].type == "text" and message.content[0].text == "report text"
    streamed = MESSAGES.parse(
        b'{"model":"claude-x","stream":true,"messages":[{"role":"user","content":"hi"}]}'
    )
    text = "x" * 900
    sse = MESSAGES.command_reply(text, streamed, request_id="cb-2")
    assert not isinstance(sse.body, bytes)

    async def collect() -> bytes:
        return b"".join([chunk async for chunk in sse.body])  # type: ignore[union-attr]

    events = [e for e in asyncio.run(collect()).decode().split("\n\n") if e]
    names = [e.split("\n")[0].removeprefix("event: ") for e in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    deltas = [json.loads(e.split("data: ", 1)[1]) for e in events if "content_block_delta" in e]
    assert "".join(d["delta"]["text"] for d in deltas) == text


@pytest.mark.skipif(not CAPTURES, reason="shared OpenClaw Messages captures not present")
@pytest.mark.parametrize(("name", "raw"), CAPTURES, ids=[n for n, _ in CAPTURES])
def test_openclaw_captures_clamp_within_caps_and_keep_their_skeleton(name: str, raw: bytes) -> None:
    body = orjson.loads(raw)
    out, segments = clamped(raw)
    sent = orjson.loads(out)
    assert skeleton(sent) == skeleton(body)
    assert markers(sent) == markers(body)
    assert thinking_blocks(sent) == thinking_blocks(body)
    assert {s.kind for s in segments if s.action == "clamped"} >= {"bootstrap", "web_fetch"}
    assert all(s.after <= s.cap for s in segments if s.action == "clamped" and s.cap is not None)
    assert clamped(out)[0] == out
    assert clamped(raw, apply=False)[0] == raw


_texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)


@settings(max_examples=60, deadline=None)
@given(
    page_chars=st.integers(0, 30_000),
    snippets=st.lists(st.integers(0, 3000), max_size=5),
    marked=st.lists(st.booleans(), min_size=6, max_size=6),
    extra=_texts,
    as_blocks=st.booleans(),
)
def test_property_markers_thinking_and_blocks_survive_any_clamp(
    page_chars: int, snippets: list[int], marked: list[bool], extra: str, as_blocks: bool
) -> None:
    body = request()
    results = body["messages"][2]["content"]
    page = web_fetch_result(content=("word " * (page_chars // 5 + 1))[:page_chars] + extra)
    results[0]["content"] = [{"type": "text", "text": page}] if as_blocks else page
    results[1]["content"] = memory_search_result(snippets=["s" * n for n in snippets])
    blocks = [body["system"][0], body["system"][1], *results, body["messages"][0]["content"][0]]
    for block, on in zip(blocks, marked, strict=True):
        if on:
            block["cache_control"] = EPHEMERAL
        else:
            block.pop("cache_control", None)
    raw = orjson.dumps(body)
    out, segments = clamped(raw)
    sent = orjson.loads(out)
    assert markers(sent) == markers(body)
    assert thinking_blocks(sent) == thinking_blocks(body)
    assert skeleton(sent) == skeleton(body)
    assert clamped(raw)[0] == out  # deterministic
    assert clamped(out)[0] == out  # idempotent
    assert all(s.after <= s.cap for s in segments if s.action == "clamped" and s.cap is not None)


# -- Claude Code (issue 21) ----------------------------------------------------------------

AGENT_CAPS = Caps(
    bootstrap_max_chars=8000,
    memory_max_chars=2500,
    web_fetch_max_chars=8000,
    tool_output_max_chars=16000,
)


def agent_clamped(body: dict[str, Any], *, apply: bool = True) -> tuple[bytes, list[Any]]:
    parsed = MESSAGES.parse(orjson.dumps(body))
    segments = parsed.clamp(clamp_request, AGENT_CAPS, ToolNames(), apply=apply)
    return parsed.encode(), segments


def test_claude_codes_claude_md_is_clamped_and_its_other_blocks_kept() -> None:
    from tests.agents import BIG_MD, FILE, LOG, claude_code_request

    lookup = [{"type": "tool_reference", "tool_name": "WebFetch"}]
    body = claude_code_request(
        turns=[
            ("Read", {"file_path": "/w/big.py"}, FILE),
            ("ToolSearch", {"query": "select:WebFetch", "max_results": 1}, lookup),
            ("Bash", {"command": "pytest"}, LOG),
        ]
    )
    out, segments = agent_clamped(body)
    sent = orjson.loads(out)
    assert [(s.kind, s.label, s.action, s.message_index) for s in segments] == [
        ("bootstrap", "/w/CLAUDE.md", "clamped", 0),
        ("tool_output", "Bash toolu_02abcdef", "clamped", 7),
    ]
    assert segments[0].before == len(BIG_MD) and segments[0].after == 8000
    first, original = sent["messages"][0]["content"], body["messages"][0]["content"]
    assert first[1:] == original[1:]  # the attribution reminder and the user's own text
    assert "[...truncated, read /w/CLAUDE.md for full content...]" in first[0]["text"]
    assert sent["messages"][3]["content"][0]["content"] == FILE  # Read: never cut
    assert sent["messages"][5]["content"][0]["content"] == lookup  # tool_reference: untouched
    assert len(sent["messages"][7]["content"][0]["content"]) <= 16000
    assert skeleton(sent) == skeleton(body)
    assert markers(sent) == markers(body)
    assert thinking_blocks(sent) == thinking_blocks(body)
    for key in ("tools", "system", "metadata", "thinking", "context_management"):
        assert sent[key] == body[key]
    again, _ = agent_clamped(body)
    assert again == out  # the same bytes on every request: the prompt cache holds


def test_claude_codes_user_text_is_never_clamped() -> None:
    from tests.agents import RULES, claude_code_request

    body = claude_code_request(claude_md="short", prompt="/ctxbudget\n" + RULES * 3)
    out, segments = agent_clamped(body)
    assert out == orjson.dumps(body)  # nothing changed: the client's bytes go on
    assert [(s.label, s.action) for s in segments] == [("/w/CLAUDE.md", "kept")]


def test_the_webfetch_summariser_page_is_a_web_fetch_segment() -> None:
    from tests.agents import summariser_request

    page = "Paragraph: lorem ipsum dolor sit amet.\n\n" * 2000
    out, [segment] = agent_clamped(summariser_request(page))
    assert (segment.kind, segment.tool, segment.action) == ("web_fetch", "WebFetch", "clamped")
    text = orjson.loads(out)["messages"][0]["content"][0]["text"]
    assert segment.after <= 8000 and text.endswith("exact song lyrics.\n\n")
