from __future__ import annotations

import doctest
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import caps._json
import caps.snippets
import caps.webfetch
from caps import Caps, ToolNames, clamp_request
from caps._text import utf16_len
from caps.toolresults import clamp_tool_results
from tests.openclaw import (
    load_fixtures,
    memory_get_result,
    memory_search_result,
    tool_call,
    web_fetch_result,
    wrap_untrusted,
)

CAPS = Caps(bootstrap_max_chars=8000, memory_max_chars=600, web_fetch_max_chars=2000)
TOOLS = ToolNames()
START = '<<<EXTERNAL_UNTRUSTED_CONTENT id="9b0b037e278b35bf">>>'
END = '<<<END_EXTERNAL_UNTRUSTED_CONTENT id="9b0b037e278b35bf">>>'


def _turn(name: str, content: Any, args: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "go"},
        tool_call("callx1", name, args or {}),
        {"role": "tool", "tool_call_id": "callx1", "content": content},
    ]


@pytest.mark.parametrize("module", [caps._json, caps.snippets, caps.webfetch])
def test_doctests(module: Any) -> None:
    assert doctest.testmod(module).failed == 0


@pytest.mark.parametrize("version", ["4.x", "9.x"])
def test_web_fetch_is_cut_inside_the_wrapper(version: str) -> None:
    content = web_fetch_result(version=version, content="lorem ipsum " * 1000)
    messages = _turn("web_fetch", content, {"url": "https://example.com/page"})
    out, [segment] = clamp_tool_results(messages, CAPS, TOOLS)
    payload = json.loads(out[2]["content"])
    text = payload["text"]
    assert utf16_len(text) <= 2000 and segment.after == utf16_len(text)
    assert payload["truncated"] is True and payload["length"] == utf16_len(text)
    assert text.count(START) == 1 and text.count(END) == 1
    assert text.startswith("SECURITY NOTICE:")
    assert "[...truncated by ctxbudget: kept " in text
    assert segment.label == "web_fetch callx1 https://example.com/page"
    assert segment.url == "https://example.com/page"
    original = json.loads(content)
    assert {k: v for k, v in payload.items() if k not in ("text", "truncated", "length")} == {
        k: v for k, v in original.items() if k not in ("text", "truncated", "length")
    }
    assert list(payload) == list(original), "key order is kept"
    assert out[2]["content"].startswith('{\n  "url": ')  # JSON.stringify(payload, null, 2)
    assert messages[2]["content"] == content, "the input is never mutated"


def test_results_under_their_cap_stay_byte_identical() -> None:
    content = web_fetch_result(content="short")
    messages = _turn("web_fetch", content)
    out, [segment] = clamp_tool_results(messages, CAPS, TOOLS)
    assert out is messages and segment.action == "kept"


def test_memory_search_keeps_rank_order_then_cuts_then_drops() -> None:
    content = memory_search_result(snippets=["a" * 200, "b" * 200, "c" * 200, "d" * 200])
    out, [segment] = clamp_tool_results(_turn("memory_search", content), CAPS, TOOLS)
    payload = json.loads(out[2]["content"])
    snippets = [r["snippet"] for r in payload["results"]]
    assert sum(utf16_len(s) for s in snippets) <= 600
    assert snippets[0].startswith("a") and snippets[1].startswith("b")
    assert snippets[2].startswith("c") and snippets[2].endswith("\n[…truncated]")
    assert len(snippets) == 3 and segment.note == "1 of 4 results dropped"
    assert payload["truncated"] is True


def test_memory_get_says_where_to_continue() -> None:
    text = "".join(f"- fact {i}: the deadline is day {i}\n" for i in range(100))
    out, [segment] = clamp_tool_results(
        _turn("memory_get", memory_get_result(text=text)), CAPS, TOOLS
    )
    payload = json.loads(out[2]["content"])
    assert utf16_len(payload["text"]) <= 600
    assert payload["truncated"] is True
    assert payload["text"].endswith(
        f"[More content available. Use from={payload['nextFrom']} to continue.]"
    )
    assert f"day {payload['nextFrom'] - 2}\n" in payload["text"]
    assert segment.kind == "memory" and segment.action == "clamped"


def test_error_results_and_other_tools_are_left_alone() -> None:
    error = json.dumps({"status": "error", "tool": "web_fetch", "error": "Blocked hostname"})
    messages = _turn("web_fetch", error) + _turn("exec", "x" * 50_000)[1:]
    messages[3]["tool_calls"][0]["id"] = "callx2"
    messages[4]["tool_call_id"] = "callx2"
    out, segments = clamp_tool_results(messages, CAPS, TOOLS)
    assert out is messages and segments == []


def test_tool_search_bridge_envelope_wrapped_in_untrusted_content() -> None:
    inner = web_fetch_result(content="lorem ipsum " * 1000)
    envelope = json.dumps(
        {
            "tool": {"id": "openclaw:core:web_fetch", "name": "web_fetch", "source": "openclaw"},
            "result": {"content": [{"type": "text", "text": inner}]},
        },
        indent=2,
    )
    content = wrap_untrusted(envelope, id_hex="aaaabbbbccccdddd", source="API")
    messages = [
        {"role": "user", "content": "go"},
        tool_call("calltool7", "tool_call", {"id": "web_fetch", "args": {"url": "https://e.x/"}}),
        {"role": "tool", "tool_call_id": "calltool7", "content": content},
    ]
    out, [segment] = clamp_tool_results(messages, CAPS, TOOLS)
    assert segment.kind == "web_fetch" and segment.tool == "web_fetch"
    new = out[2]["content"]
    assert new.count('<<<EXTERNAL_UNTRUSTED_CONTENT id="aaaabbbbccccdddd">>>') == 1
    assert new.endswith('<<<END_EXTERNAL_UNTRUSTED_CONTENT id="aaaabbbbccccdddd">>>')
    body = new.split("\nSource: API\n---\n", 1)[1].rsplit("\n<<<END_EXTERNAL", 1)[0]
    inner_payload = json.loads(json.loads(body)["result"]["content"][0]["text"])
    assert utf16_len(inner_payload["text"]) <= 2000


def test_a_bridge_envelope_cut_by_openclaw_is_cut_only_inside_its_wrapper() -> None:
    envelope = '{"tool": {"name": "web_fetch"}, "result": {"content": [{"type": "text", "text": "'
    content = wrap_untrusted(envelope + "x" * 30_000 + "\n[truncated]", source="API")
    messages = _turn("tool_call", content, {"id": "web_fetch"})
    out, [segment] = clamp_tool_results(messages, CAPS, TOOLS)
    new = out[2]["content"]
    assert utf16_len(new) <= 2000 and new.endswith(END) and START in new
    assert segment.note == "unparseable JSON (cut upstream): clamped as text"


def test_memory_result_cut_by_openclaw_is_left_as_is() -> None:
    content = memory_search_result(snippets=["a" * 500] * 4)[:1500]
    content += "\n[... 900 more characters truncated; rerun with narrower args if needed]"
    messages = _turn("memory_search", content)
    out, [segment] = clamp_tool_results(messages, CAPS, TOOLS)
    assert out is messages and segment.action == "kept"
    assert segment.note == "unparseable JSON (cut upstream): left as is"


def test_content_parts_and_unknown_call_ids() -> None:
    content = [{"type": "text", "text": web_fetch_result(content="z" * 5000)}]
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "trimmed-history", "content": content},
    ]
    out, [segment] = clamp_tool_results(messages, CAPS, TOOLS)
    assert utf16_len(json.loads(out[1]["content"][0]["text"])["text"]) <= 2000
    assert segment.tool == "web_fetch", "recognised from its payload"


def test_tool_names_are_configurable() -> None:
    content = web_fetch_result(content="z" * 5000)
    messages = _turn("fetch_url", content)
    assert clamp_tool_results(messages, CAPS, TOOLS)[1] == []
    tools = ToolNames(web_fetch=frozenset({"fetch_url"}))
    _, [segment] = clamp_tool_results(messages, CAPS, tools)
    assert segment.action == "clamped"


def test_captured_tool_results_within_caps_and_idempotent() -> None:
    for name, request in load_fixtures():
        result = clamp_request(request, CAPS)
        again = clamp_request(result.request, CAPS)
        assert again.request == result.request and not again.changed, name
        for message in result.request["messages"]:
            if message["role"] == "tool":
                json.loads(message["content"])


# -- properties ------------------------------------------------------------------------

texts = st.text(
    st.characters(min_codepoint=1, max_codepoint=0x1F64F, exclude_categories=("Cs",)), max_size=4000
)


@settings(max_examples=120, deadline=None)
@given(
    page=texts,
    cap=st.integers(min_value=0, max_value=5000),
    version=st.sampled_from(["4.x", "9.x"]),
)
def test_web_fetch_properties(page: str, cap: int, version: str) -> None:
    caps_ = Caps(web_fetch_max_chars=cap)
    messages = _turn("web_fetch", web_fetch_result(version=version, content=page))
    out, [segment] = clamp_tool_results(messages, caps_, TOOLS)
    payload = json.loads(out[2]["content"])  # valid JSON stays valid JSON
    text = payload["text"]
    if segment.action == "clamped":
        assert utf16_len(text) <= cap and len(text) <= cap
        assert text.count(START) == 1 and text.count(END) == 1
    else:
        assert out is messages
    assert clamp_tool_results(messages, caps_, TOOLS)[0] == out  # deterministic
    assert clamp_tool_results(out, caps_, TOOLS)[0] == out  # idempotent


@settings(max_examples=120, deadline=None)
@given(snippets=st.lists(texts, max_size=6), cap=st.integers(min_value=0, max_value=3000))
def test_memory_search_properties(snippets: list[str], cap: int) -> None:
    caps_ = Caps(memory_max_chars=cap)
    messages = _turn("memory_search", memory_search_result(snippets=snippets))
    out, [segment] = clamp_tool_results(messages, caps_, TOOLS)
    payload = json.loads(out[2]["content"])
    total = sum(utf16_len(r["snippet"]) for r in payload["results"])
    assert total <= cap or segment.action == "kept"
    assert clamp_tool_results(out, caps_, TOOLS)[0] == out


@settings(max_examples=120, deadline=None)
@given(text=texts, cap=st.integers(min_value=0, max_value=3000))
def test_memory_get_properties(text: str, cap: int) -> None:
    caps_ = Caps(memory_max_chars=cap)
    messages = _turn("memory_get", memory_get_result(text=text))
    out, _ = clamp_tool_results(messages, caps_, TOOLS)
    got = json.loads(out[2]["content"])["text"]
    assert utf16_len(got) <= max(cap, utf16_len(text) if utf16_len(text) <= cap else cap)
    assert clamp_tool_results(out, caps_, TOOLS)[0] == out


def test_an_unwrapped_page_is_left_whole_and_says_why() -> None:
    from caps import Caps, clamp_request

    payload = {"url": "https://e.com", "text": "plain page " * 2000}
    request = {
        "messages": [
            {
                "role": "assistant",
                "tool_calls": [{"id": "c1", "function": {"name": "web_fetch", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": json.dumps(payload)},
        ]
    }
    result = clamp_request(request, Caps(web_fetch_max_chars=8000))
    (segment,) = result.segments
    assert not result.changed and segment.action == "kept"
    assert segment.note == "no untrusted-content wrapper to cut inside: left whole"


# -- what a clamp cannot read is left as it came (issue 24) -----------------------------------


def test_arguments_sent_as_an_object_are_not_read() -> None:
    page = web_fetch_result(version="9.x", content="p" * 9000)
    messages = _turn("web_fetch", page)
    messages[1]["tool_calls"][0]["function"]["arguments"] = {"url": "https://example.com"}
    out, [segment] = clamp_tool_results(messages, CAPS, TOOLS)
    assert segment.action == "clamped"  # known by the tool name; the URL by the result
    assert utf16_len(out[2]["content"]) < len(page)


def test_a_lone_surrogate_is_one_unit_as_javascript_counts_it() -> None:
    page = "\ud800" + "p" * 9000
    messages = _turn("web_fetch", web_fetch_result(version="9.x", content=page))
    out, [segment] = clamp_tool_results(messages, CAPS, TOOLS)
    assert segment.action == "clamped" and segment.after <= CAPS.web_fetch_max_chars
    payload = json.loads(out[2]["content"])
    assert payload["length"] == utf16_len(payload["text"])
    assert "\ud800" in payload["text"]
    memory = _turn("memory_get", memory_get_result(text="\udfff" + "- fact\n" * 500))
    _, [got] = clamp_tool_results(memory, CAPS, TOOLS)
    assert got.action == "clamped" and got.after <= CAPS.memory_max_chars


@pytest.mark.parametrize("depth", [900, 1100])
def test_json_nested_too_deeply_to_rewrite_is_kept(depth: int) -> None:
    result = web_fetch_result(version="9.x", content="p" * 9000)
    nested = result[:-1].rstrip() + ', "deep": ' + "[" * depth + "]" * depth + "}"
    out, [segment] = clamp_tool_results(_turn("web_fetch", nested), CAPS, TOOLS)
    assert out[2]["content"] is nested
    assert segment.action == "kept" and segment.after == segment.before


def test_what_the_clamps_keep_is_bounded_by_its_size_not_a_count() -> None:
    # a cache of 256 entries of any size held 256 results: with ~1 MB tool outputs, 256 MB
    # of a process (30 MB each in the offload worker); now a bound in bytes (16 MB)
    import gc
    import tracemalloc

    from caps import Caps, ToolNames, clamp_request

    caps = Caps(tool_output_max_chars=16_000)
    tracemalloc.start()
    try:
        for n in range(60):
            output = f"{n} " + "line of build output\n" * 50_000  # ~1 MB, a new one each time
            request = {
                "messages": [
                    tool_call(f"c{n}", "exec", {"command": "make"}),
                    {"role": "tool", "tool_call_id": f"c{n}", "content": output},
                ]
            }
            assert clamp_request(request, caps, tools=ToolNames()).changed
            del output, request
        gc.collect()
        alive, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert alive < 40 << 20  # ~60 MB before


def test_a_text_part_that_is_not_a_string_is_left_as_sent() -> None:
    """`{"type": "text", "text": 5}` beside a long text made the clamp raise, so it gave up on
    the whole request (issue 35): the odd part stays as sent, the rest is clamped."""
    long = "y" * 30_000
    request = {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": 5}, {"type": "text", "text": long}],
            },
            tool_call("t", "exec", {}),
            {
                "role": "tool",
                "tool_call_id": "t",
                "content": [{"type": "text", "text": 5}, {"type": "text", "text": long}],
            },
        ]
    }
    result = clamp_request(request, Caps(tool_output_max_chars=1000))
    assert result.request["messages"][0] == request["messages"][0]
    assert result.request["messages"][2]["content"][0] == {"type": "text", "text": 5}
    assert [s.action for s in result.segments] == ["clamped"]
