from __future__ import annotations

import doctest
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ctxbudget.caps import Caps, PrunePolicy, clamp_request, prune, prune_request
from ctxbudget.caps._text import utf16_len
from ctxbudget.caps.prune import digest, prunable, pruned_text

POLICY = PrunePolicy(keep_last_assistants=2, min_chars=100, soft_max_chars=400)


def _call(call_id: str, name: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}
        ],
    }


def _result(call_id: str, content: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _session(n: int, size: int = 1000) -> list[dict[str, Any]]:
    """A system prompt, a user turn, then `n` tool turns (exec, read, exec, ...)."""
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "fix the bug"},
    ]
    for i in range(n):
        name = "read" if i % 2 else "exec"
        out += [_call(f"c{i}", name), _result(f"c{i}", f"{i:04d} " + "x" * size)]
    return out


def test_the_docstring_examples_hold() -> None:
    assert doctest.testmod(prune).failed == 0


def test_results_after_the_newest_assistants_are_never_prunable() -> None:
    messages = _session(5)
    found = [c.call_id for c in prunable(messages, POLICY)]
    # two assistant turns kept: c3's and c4's results come after the 2nd-last assistant
    assert found == ["c0", "c1", "c2"]
    assert prunable(_session(2), POLICY) == []  # only the newest two turns: nothing


def test_short_results_denied_tools_and_images_are_left_alone() -> None:
    messages = _session(6)
    messages[3] = _result("c0", "short")
    messages[5] = _result(
        "c1", [{"type": "text", "text": "x" * 500}, {"type": "image_url", "image_url": {}}]
    )
    deny = PrunePolicy(keep_last_assistants=2, min_chars=100, deny=("rea*",))
    assert [c.call_id for c in prunable(messages, deny)] == ["c2"]
    allow = PrunePolicy(keep_last_assistants=2, min_chars=100, allow=("read",))
    assert [c.call_id for c in prunable(messages, allow)] == ["c3"]


def test_a_pruned_result_says_what_it_was_and_is_never_longer() -> None:
    text = "head " + "y" * 5000 + " tail"
    soft = pruned_text(text, "exec", "call_1", POLICY)
    assert soft is not None and soft.startswith("head ") and soft.endswith(" tail")
    assert "exec call_1" in soft and "5,010 chars" in soft and utf16_len(soft) < 5010
    hard = pruned_text("z" * 300, "read", "call_2", POLICY)
    assert hard == (
        "[Old tool result content cleared] (read call_2, 300 chars: run the tool again if "
        "you need it)"
    )
    off = PrunePolicy(min_chars=100, soft_max_chars=400, hard_clear=False)
    assert pruned_text("z" * 300, "read", "call_2", off) is None


def test_the_clamp_reports_prunable_results_and_changes_nothing_for_them() -> None:
    request = {"messages": _session(4)}
    result = clamp_request(request, Caps(prune=POLICY))
    assert not result.changed
    found = [s for s in result.segments if s.action == "prunable"]
    assert [(s.kind, s.call_id, s.before) for s in found] == [
        ("pruned", "c0", 1005),
        ("pruned", "c1", 1005),
    ]
    assert all(s.after < s.before and s.clamped for s in found)
    assert not [s for s in clamp_request(request, Caps()).segments if s.action == "prunable"]


def test_decisions_apply_as_decided_and_the_rest_stays_byte_identical() -> None:
    messages = _session(4)
    c0, c1 = digest(messages[3]["content"]), digest(messages[5]["content"])
    caps = Caps(prune=POLICY, pruned=(("c0", c0, None), ("c1", c1, "DECIDED EARLIER")),
                pruned_now=frozenset({("c0", c0)}))  # fmt: skip
    result = prune_request({"messages": messages}, caps)
    new = result.request["messages"]
    assert new[5]["content"] == "DECIDED EARLIER"
    assert new[3]["content"] == pruned_text(messages[3]["content"], "exec", "c0", POLICY)
    assert [m is n for m, n in zip(messages, new, strict=True)] == [
        True, True, True, False, True, False, True, True, True, True,
    ]  # fmt: skip
    notes = {s.call_id: s.note for s in result.segments}
    assert notes == {"c0": "pruned now", "c1": "pruned earlier"}
    assert {s.call_id: s.digest for s in result.segments} == {"c0": c0, "c1": c1}


def test_a_decision_lands_only_on_the_result_it_was_taken_for() -> None:
    """Issue 31, item 5: a call id does not name a result (`call_0` in every run of a local
    model); a decision bound to another result's digest leaves this one as it is."""
    messages = _session(4)
    other = digest("another run's result under the same call id")
    caps = Caps(prune=POLICY, pruned=(("c0", other, "NOT MINE"), ("c1", other, None)))
    result = prune_request({"messages": messages}, caps)
    assert result.request["messages"] is messages and not result.changed
    assert result.segments == ()


@given(st.integers(min_value=0, max_value=6), st.integers(min_value=0, max_value=3000))
def test_pruning_is_deterministic_and_idempotent(turns: int, size: int) -> None:
    messages = _session(turns, size)
    ids = tuple((c.call_id, digest(c.text), None) for c in prunable(messages, POLICY))
    caps = Caps(prune=POLICY, pruned=ids)
    once = prune_request({"messages": messages}, caps).request["messages"]
    again = prune_request({"messages": messages}, caps).request["messages"]
    assert once == again  # the same bytes every request
    # decisions taken from what the first pass wrote give the same request again
    decided = tuple(
        (old["tool_call_id"], digest(old["content"]), new["content"])
        for old, new in zip(messages, once, strict=True)
        if old.get("role") == "tool"
    )
    assert prune_request({"messages": messages}, Caps(pruned=decided)).request["messages"] == once
    for old, new in zip(messages, once, strict=True):
        if old.get("role") == "tool":
            assert utf16_len(new["content"]) <= utf16_len(old["content"])
