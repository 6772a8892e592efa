from __future__ import annotations

import dataclasses
import doctest
import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxbudget.caps._cut
import ctxbudget.caps.tooloutput
from ctxbudget.caps import Caps, ToolNames, clamp_request
from ctxbudget.caps._text import utf16_len
from ctxbudget.caps.tooloutput import clamp_output
from tests.openclaw import tool_call, wrap_untrusted

CAP = 2000
CAPS = Caps(tool_output_max_chars=CAP, web_fetch_max_chars=8000, memory_max_chars=2500)
LOG = "".join(f"test_{i:04d} PASSED\n" for i in range(3000)) + "=== 1 failed, 2999 passed ===\n"


def _request(name: str, content: Any, call_id: str = "call_1") -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": "go"},
            tool_call(call_id, name, {}),
            {"role": "tool", "tool_call_id": call_id, "content": content},
        ]
    }


@pytest.mark.parametrize("module", [ctxbudget.caps._cut, ctxbudget.caps.tooloutput])
def test_doctests(module: Any) -> None:
    assert doctest.testmod(module).failed == 0


@pytest.mark.parametrize("tool", ["Bash", "Grep", "mcp__inventory__lookup", "exec_command", "exec"])
def test_other_tools_keep_head_and_tail(tool: str) -> None:
    result = clamp_request(_request(tool, LOG), CAPS)
    (segment,) = result.segments
    out = result.request["messages"][2]["content"]
    assert (segment.kind, segment.label, segment.tool, segment.action) == (
        "tool_output",
        f"{tool} call_1",
        tool,
        "clamped",
    )
    assert utf16_len(out) == segment.after <= CAP and segment.before == utf16_len(LOG)
    assert out.startswith("test_0000 PASSED\n") and out.endswith("=== 1 failed, 2999 passed ===\n")
    assert f"of {utf16_len(LOG)} chars of this tool result; run it again, narrower" in out


@pytest.mark.parametrize(
    "tool",
    ["Read", "read", "read_file", "view", "Edit", "Write", "MultiEdit", "NotebookEdit", "edit",
     "write", "apply_patch"],
)  # fmt: skip
def test_tools_agents_edit_from_are_never_cut(tool: str) -> None:
    request = _request(tool, LOG)
    result = clamp_request(request, CAPS)
    assert not result.changed and result.segments == ()


def test_keep_whole_is_configurable() -> None:
    tools = ToolNames(keep_whole=frozenset({"Bash"}))
    assert not clamp_request(_request("Bash", LOG), CAPS, tools=tools).changed
    assert clamp_request(_request("Read", LOG), CAPS, tools=tools).changed


def test_results_under_the_cap_and_unknown_calls_are_not_reported() -> None:
    assert clamp_request(_request("Bash", "ok\n"), CAPS).segments == ()
    orphan = {"messages": [{"role": "tool", "tool_call_id": "nobody", "content": LOG}]}
    result = clamp_request(orphan, CAPS)  # its tool could be a Read: never cut
    assert not result.changed and result.segments == ()
    assert clamp_request(_request("Bash", LOG), Caps()).segments == ()  # no cap: nothing


def test_a_json_result_stays_json_with_its_long_strings_cut() -> None:
    payload = {
        "issues": [{"id": i, "title": f"Issue {i}", "body": "words " * 400} for i in range(3)],
        "total": 3,
    }
    text = json.dumps(payload, indent=2)
    result = clamp_request(_request("mcp__github__list_issues", text), CAPS)
    out = result.request["messages"][2]["content"]
    data = json.loads(out)
    assert utf16_len(out) <= CAP
    assert data["total"] == 3 and [i["id"] for i in data["issues"]] == [0, 1, 2]
    assert [i["title"] for i in data["issues"]] == ["Issue 0", "Issue 1", "Issue 2"]
    assert all("truncated" in i["body"] for i in data["issues"])
    assert out.startswith("{\n  ")  # written back in its own layout


def test_a_json_array_stays_json() -> None:
    text = json.dumps([{"path": f"/w/{i}.py", "text": "x" * 900} for i in range(10)])
    out, note = clamp_output(text, CAP)
    assert note is None and utf16_len(out) <= CAP
    assert [r["path"] for r in json.loads(out)] == [f"/w/{i}.py" for i in range(10)]


def test_json_that_cannot_fit_is_left_whole_and_says_why() -> None:
    text = json.dumps({"ids": list(range(2000))})
    result = clamp_request(_request("mcp__db__ids", text), CAPS)
    (segment,) = result.segments
    assert not result.changed and segment.action == "kept"
    assert segment.note == "JSON result whose structure alone is over the cap: left whole"


NESTED = "[" + ",".join(["[" * 200 + "]" * 200] * 2600) + "]"
"""Issue 35: ~1 MB, 520,201 lists, not one `{`: parsing and walking it took 0.6 s."""
MIXED = "[" + ",".join(['[{"a":' * 100 + "1" + "}]" * 100] * 2600) + "]"
"""The same of lists and objects in turn, 2 MB: 1 s."""


@pytest.mark.parametrize("text", [NESTED, MIXED], ids=["lists", "mixed"])
@pytest.mark.parametrize("cap", [16_000, 100_000])
def test_json_of_much_structure_is_left_whole_unwalked(text: str, cap: int) -> None:
    # counted before parsing, whatever the cap: 520,000 values cost ~1 µs each per walk
    # this thread's CPU time, not the wall clock's: the cost, whatever else the machine runs
    started = time.thread_time()
    result = clamp_request(
        _request("exec", text), dataclasses.replace(CAPS, tool_output_max_chars=cap)
    )
    took = time.thread_time() - started
    (segment,) = result.segments
    assert not result.changed and segment.action == "kept"
    assert segment.note == (
        "JSON result whose structure alone is over the cap: left whole"
        if cap == 16_000
        else "JSON result of over 32,768 characters of structure: left whole"
    )
    assert took < 0.25, f"{took:.2f} s"  # 0.7-1.1 s walked; ~10-30 ms counted


def test_brackets_inside_strings_are_text() -> None:
    # a result whose strings are full of brackets and commas: its structure is three values
    text = json.dumps({"log": "[[{," * 100_000, "tail": "]]}," * 100_000, "n": 1})
    out, note = clamp_output(text, CAP)
    assert note is None and utf16_len(out) <= CAP
    data = json.loads(out)
    assert data["n"] == 1 and data["log"].startswith("[[{,") and data["tail"].endswith("]]},")


def test_a_log_that_starts_with_a_bracket_is_cut_as_text() -> None:
    log = "".join(f"[INFO] step {i}, ok, [{i}]\n" for i in range(20_000)) + "[ERROR] failed\n"
    out, note = clamp_output(log, CAP)
    assert note is None and utf16_len(out) <= CAP and out.endswith("[ERROR] failed\n")


@pytest.mark.parametrize("depth", [129, 900])
def test_json_nested_too_deep_is_left_whole(depth: int) -> None:
    # 900 deep (orjson parses 1,024) made the recursive walk raise: the clamp gave up on the
    # whole request, a 500 with `failClosed`
    text = "[" * depth + json.dumps("x" * 20_000) + "]" * depth
    result = clamp_request(_request("exec", text), CAPS)
    (segment,) = result.segments
    assert not result.changed and segment.action == "kept"
    assert segment.note == "JSON result nested over 128 levels: left whole"
    shallow = "[" * 128 + json.dumps("x" * 20_000) + "]" * 128
    out, note = clamp_output(shallow, CAP)
    assert note is None and utf16_len(out) <= CAP and json.loads(out)


def test_openclaw_wrapped_output_is_cut_inside_its_wrapper() -> None:
    text = wrap_untrusted("browser snapshot line\n" * 2000, source="Browser")
    out, note = clamp_output(text, CAP)
    assert note is None and utf16_len(out) <= CAP
    start, end = text.split("\n---\n", 1)[0], text.rsplit("\n", 1)[1]
    assert out.startswith(start) and out.endswith(end)
    assert clamp_output(text, 100) == (
        text,
        "cap smaller than the untrusted-content markers: left whole",
    )


def test_parts_of_a_result_are_each_cut_and_other_parts_kept() -> None:
    content = [{"type": "text", "text": LOG}, {"type": "image", "source": {"data": "AAAA"}}]
    result = clamp_request(_request("mcp__shot__take", content), CAPS)
    out = result.request["messages"][2]["content"]
    assert utf16_len(out[0]["text"]) <= CAP and out[1] is content[1]


texts = st.text(
    st.characters(min_codepoint=1, max_codepoint=0x1F64F, exclude_categories=("Cs",)), max_size=5000
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | texts,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(text=texts, cap=st.integers(min_value=0, max_value=6000))
def test_text_properties(text: str, cap: int) -> None:
    out, note = clamp_output(text, cap)
    assert utf16_len(out) <= cap or (note is not None and out == text)  # never over the cap
    assert clamp_output(text, cap) == (out, note)  # deterministic
    assert clamp_output(out, cap)[0] == out  # idempotent


@settings(max_examples=150, deadline=None)
@given(value=json_values, cap=st.integers(min_value=0, max_value=6000), indent=st.booleans())
def test_json_properties(value: Any, cap: int, indent: bool) -> None:
    text = json.dumps(value, indent=2 if indent else None, ensure_ascii=False)
    out, note = clamp_output(text, cap)
    assert utf16_len(out) <= cap or out == text  # never over the cap, or left whole
    json.loads(out)  # valid JSON stays valid JSON
    assert clamp_output(text, cap) == (out, note)
    assert clamp_output(out, cap)[0] == out
