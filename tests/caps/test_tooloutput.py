from __future__ import annotations

import doctest
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import caps._cut
import caps.tooloutput
from caps import Caps, ToolNames, clamp_request
from caps._text import utf16_len
from caps.tooloutput import clamp_output
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


@pytest.mark.parametrize("module", [caps._cut, caps.tooloutput])
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
