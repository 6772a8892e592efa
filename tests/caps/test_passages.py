"""caps/passages.py and caps/question.py: the query-aware cut and the question it answers,
and the clamps' properties under both strategies."""

from __future__ import annotations

import doctest
import json
import statistics
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ctxbudget.caps.passages
import ctxbudget.caps.question
from ctxbudget.caps import Caps, clamp_request, utf16_len
from ctxbudget.caps.passages import pick
from ctxbudget.caps.tooloutput import clamp_output
from ctxbudget.caps.webfetch import clamp_wrapped, wrap

STRATEGIES = ["query", "head"]


@pytest.mark.parametrize("module", [ctxbudget.caps.passages, ctxbudget.caps.question])
def test_doctests(module: Any) -> None:
    assert doctest.testmod(module).failed == 0


def _page(chars: int = 100_000) -> str:
    topics = ("weather", "parking", "cycling", "shops", "walks", "birds", "tides", "castles")
    return (
        "# Island guide\n\n"
        + "\n\n".join(
            f"Note {i} on {topics[i % 8]}: the council posted an update about "
            f"{topics[i * 3 % 8]} and visitors in season {i % 11}, with times and prices."
            for i in range(chars // 100)
        )
    )[:chars]


def test_a_100_kb_page_is_picked_in_a_few_milliseconds() -> None:
    page = _page()
    times = []
    for _ in range(9):
        # this thread's CPU time, not the wall clock's: the cost, whatever else the machine runs
        start = time.thread_time()
        pick(page, 7000, "parking prices near the castles in season 7?", how="x")
        times.append(time.thread_time() - start)
    # the target is 5 ms (bench/evidence.py measures ~2-3 ms); room for a busy machine
    assert statistics.median(times) < 0.025


_PROSE = ("The quick brown fox jumps over the lazy dog near the river bank.\n" * 2000)[:100_000]
_MANY_TERMS = " ".join(f"{a}{b}{c}" for a in "abcdefghij" for b in "klmnopqrst" for c in "uvwxyz")
CRAFTED = {
    # each held the event loop this long per 100 KB before (a clamp of a body under the
    # offload threshold runs there): the target is 5 ms
    "a 4,000-char question of ~1,000 terms (788 ms)": (_PROSE, _MANY_TERMS, False),
    "a dotted capital I, lower-cased to two (79 ms)": (_PROSE[:-1] + "\u0130", "ferry", False),
    "25,000 one-word paragraphs (43 ms)": ("ab\n\n" * 25_000, "ab", False),
    "14,000 error lines in command output (68 ms)": ("error\n\n" * 14_000, "x", True),
    "a traceback of 33,000 frames (57 ms)": (
        "traceback (most recent call last)\n" + " x\n" * 33_000,
        "x",
        True,
    ),
}


@pytest.mark.parametrize("case", CRAFTED)
def test_a_crafted_text_or_question_is_picked_in_a_few_milliseconds(case: str) -> None:
    text, asked, errors = CRAFTED[case]
    times = []
    for _ in range(5):
        # this thread's CPU time, not the wall clock's: the cost, whatever else the machine runs
        start = time.thread_time()
        pick(text, 8000, ctxbudget.caps.question.question((asked,), None), how="x", errors=errors)
        times.append(time.thread_time() - start)
    assert statistics.median(times) < 0.025, f"{statistics.median(times) * 1000:.0f} ms"


def test_error_lines_and_tracebacks_always_score_in_command_output() -> None:
    log = "".join(f"step {i}: ok\n" for i in range(3000))
    log = log.replace(
        "step 1500: ok\n",
        'Traceback (most recent call last):\n  File "a.py", line 3, in f\n    g()\n'
        "ValueError: bad input\n",
    )
    out, note = clamp_output(log, 4000, question="")  # nothing asked: the error still is
    assert note is None and utf16_len(out) <= 4000
    assert 'Traceback (most recent call last):\n  File "a.py", line 3' in out
    assert "ValueError: bad input\n" in out and out.endswith("step 2999: ok\n")
    head, _ = clamp_output(log, 4000)  # the head strategy: head and tail only
    assert "ValueError" not in head


def test_nothing_matched_is_the_head_cut_byte_for_byte() -> None:
    text = wrap(_page(30_000), "ab12")
    assert clamp_wrapped(text, 3000, question="zebra crossing") == clamp_wrapped(text, 3000)


def test_the_question_leaves_out_what_an_agent_changes_every_turn() -> None:
    def request(internal: str, later: str) -> dict[str, Any]:
        return {
            "messages": [
                {"role": "user", "content": "[Sun 2026-11-22 11:28 UTC] parking near castles?"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "web_fetch", "arguments": '{"url": "u"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": _web(_page(40_000))},
                {"role": "user", "content": later},
                {"role": "user", "content": f"<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\n{internal}"},
            ]
        }

    caps_ = Caps(web_fetch_max_chars=6000, strategy="query")
    first = clamp_request(request("turn 1", "birds?"), caps_).request["messages"][2]
    again = clamp_request(request("turn 9, 12:01", "tides?"), caps_).request["messages"][2]
    assert first == again and "[...skipped chars " in first["content"]


def _web(page: str) -> str:
    return json.dumps({"url": "u", "text": wrap(page, "ab12"), "length": 0}, indent=2)


texts = st.lists(
    st.sampled_from(
        ["a", "b ", " ", "\n", "\n\n", "# ", ".", "error", "castle", "\U0001f600", "é"]
    ),
    max_size=1500,
).map(lambda parts: "".join(parts) * 3)
questions = st.sampled_from(["", "castle", "error a", "b castles #"])


@settings(max_examples=60, deadline=None)
@given(text=texts, cap=st.integers(min_value=0, max_value=6000), question=questions)
def test_pick_properties(text: str, cap: int, question: str) -> None:
    out = pick(text, cap, question, how="ask web_fetch for the rest", errors=True, tail=True)
    if out is None:
        return
    assert utf16_len(out) <= max(cap, 0) or out == text
    assert pick(out, cap, question, how="ask web_fetch for the rest") == out  # idempotent
    again = pick(text, cap, question, how="ask web_fetch for the rest", errors=True, tail=True)
    assert again == out  # deterministic


@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(max_examples=40, deadline=None)
@given(text=texts, cap=st.integers(min_value=0, max_value=6000), question=questions)
def test_clamp_properties_for_both_strategies(
    strategy: str, text: str, cap: int, question: str
) -> None:
    asked = question if strategy == "query" else None
    for clamped in (
        clamp_output(text, cap, question=asked)[0],
        clamp_wrapped(wrap(text, "ab12"), cap, question=asked),
    ):
        if clamped is None:
            continue
        assert utf16_len(clamped) <= cap or clamped in (text, wrap(text, "ab12"))
        assert clamp_output(clamped, cap, question=asked)[0] == clamped  # idempotent
    request = {
        "messages": [
            {"role": "user", "content": question},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "c",
                        "type": "function",
                        "function": {"name": "web_fetch", "arguments": "{}"},
                    },
                    {
                        "id": "d",
                        "type": "function",
                        "function": {"name": "exec", "arguments": "{}"},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "c", "content": _web(text)},
            {"role": "tool", "tool_call_id": "d", "content": text},
        ]
    }
    caps_ = Caps(web_fetch_max_chars=cap + 300, tool_output_max_chars=cap, strategy=strategy)  # type: ignore[arg-type]
    out = clamp_request(request, caps_).request
    web = json.loads(out["messages"][2]["content"])  # valid JSON stays valid JSON
    assert utf16_len(web["text"]) <= cap + 300 or web["text"] == wrap(text, "ab12")
    assert clamp_request(out, caps_).request == out  # idempotent
    assert clamp_request(request, caps_).request == out  # deterministic
