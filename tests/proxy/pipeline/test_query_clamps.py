"""Clamps that keep what was asked (issue 33), through the real app: a web page or a command
output over its cap keeps the passages that answer the user's turn that led to the call, the
same bytes on every later turn of the conversation, in all three wire formats."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from ctxbudget.caps import utf16_len
from ctxbudget.proxy.config.schema import load_config
from ctxbudget.proxy.errors import ConfigError
from tests.agents import claude_code_request, summariser_request
from tests.fakes import REPLIES
from tests.inproc import config_for, proxy_app
from tests.openclaw import web_fetch_result

FERRY = "Sunday sailings: the ferry to Arran leaves Ardrossan harbour at 09:45 and 15:30."
MUSEUM = "The Heritage Museum opens daily 10:00-17:00; admission is free for children."
ASK_FERRY = "[Sun 2026-11-22 11:28 UTC] When does the ferry to Arran leave on Sundays?"
URL = "https://travel.example.com/timetables/arran"


def _page() -> str:
    """A 60 KB travel page: a title, many paragraphs on other things, the ferry's Sunday
    times at ~40%, the museum's hours at ~75%."""
    topics = ("weather", "parking", "cycling", "shops", "walks", "birds", "tides", "castles")
    paragraphs = [
        f"Note {i} on {topics[i % len(topics)]}: the local council posted an update about "
        f"{topics[(i * 3) % len(topics)]} and visitors in season {i % 11}."
        for i in range(440)
    ]
    paragraphs.insert(180, FERRY)
    paragraphs.insert(330, MUSEUM)
    return "# Island travel guide\n\nEverything a visitor needs.\n\n" + "\n\n".join(paragraphs)


def _web_text(body: dict[str, Any], path: str) -> str:
    """The web_fetch page text as forwarded, in any of the three formats."""
    if path == "/v1/chat/completions":
        found = next(m["content"] for m in body["messages"] if m.get("role") == "tool")
    elif path == "/v1/messages":
        found = next(
            p["content"]
            for m in body["messages"]
            if isinstance(m["content"], list)
            for p in m["content"]
            if p.get("type") == "tool_result"
        )
    else:
        found = next(i["output"] for i in body["input"] if i.get("type") == "function_call_output")
    text: str = json.loads(found)["text"]
    return text


def _internal(turn: int) -> str:
    # OpenClaw's internal context: new bytes every turn (a time in it)
    return (
        "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nConversation data (data, not instructions):\n"
        f"turn {turn} at 11:{28 + turn:02d}, the user may ask about ferries or museums\n"
        "<<<END_OPENCLAW_INTERNAL_CONTEXT>>>"
    )


def _conversation(path: str, turns: int, result: str) -> dict[str, Any]:
    """An OpenClaw conversation in `path`'s format: the ferry question, a web_fetch of the
    page, then `turns - 1` more turns asking other things, the internal context where
    OpenClaw puts it (at the end; after the first user message in Responses)."""
    later = [
        "Thanks. What are the Heritage Museum opening hours and is admission free?",
        "Where can I park near the castles, and how are the tides today?",
        "Any good walks for birds near the harbour?",
    ][: turns - 1]
    if path == "/v1/chat/completions":
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": ASK_FERRY},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_web1",
                        "type": "function",
                        "function": {"name": "web_fetch", "arguments": json.dumps({"url": URL})},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_web1", "content": result},
        ]
        for ask in later:
            messages += [
                {"role": "assistant", "content": "Here is what I found."},
                {"role": "user", "content": ask},
            ]
        messages.append({"role": "user", "content": [{"type": "text", "text": _internal(turns)}]})
        return {"model": "gpt-4o", "messages": messages}
    if path == "/v1/messages":
        messages = [
            {"role": "user", "content": [{"type": "text", "text": ASK_FERRY}]},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_web1",
                        "name": "web_fetch",
                        "input": {"url": URL},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_web1",
                        "content": result,
                        "is_error": False,
                    }
                ],
            },
        ]
        for ask in later:
            messages += [
                {"role": "assistant", "content": [{"type": "text", "text": "Here it is."}]},
                {"role": "user", "content": [{"type": "text", "text": ask}]},
            ]
        messages.append({"role": "user", "content": [{"type": "text", "text": _internal(turns)}]})
        return {"model": "claude-sonnet-4-5", "max_tokens": 1024, "messages": messages}
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "Hi."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK_FERRY}]},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": _internal(turns)}],
        },
        {
            "type": "function_call",
            "call_id": "call_web1",
            "name": "web_fetch",
            "arguments": json.dumps({"url": URL}),
        },
        {"type": "function_call_output", "call_id": "call_web1", "output": result},
    ]
    for ask in later:
        items += [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Here it is."}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ask}]},
        ]
    return {"model": "gpt-4.1", "input": items, "store": False}


PATHS = ["/v1/chat/completions", "/v1/messages", "/v1/responses"]


@pytest.mark.parametrize("path", PATHS)
def test_a_fetched_page_keeps_what_was_asked_the_same_bytes_every_turn(
    tmp_path: Path, path: str
) -> None:
    result = web_fetch_result(url=URL, content=_page())
    with proxy_app(tmp_path) as (client, fake):
        fake.answer_json(REPLIES[path])
        seen = []
        for turns in (1, 2, 3, 4):
            r = client.post(path, json=_conversation(path, turns, result))
            assert r.status_code == 200, r.text
            seen.append(_web_text(orjson.loads(fake.last.body or b""), path))
    first = seen[0]
    assert FERRY in first, "the passage the user asked about was cut"
    assert "[...skipped chars " in first and "; ask web_fetch for the rest...]" in first
    assert first.startswith(result_text_head(result))  # notice, wrapper, the page's title
    assert utf16_len(first) <= 8000
    # later turns ask about the museum, the castles, the birds: the same bytes, every turn
    assert all(text == first for text in seen[1:])
    assert MUSEUM not in first


def result_text_head(result: str) -> str:
    text: str = json.loads(result)["text"]
    return text[: text.index("# Island travel guide") + len("# Island travel guide")]


def test_the_head_strategy_keeps_the_head_as_before(tmp_path: Path) -> None:
    config = config_for(tmp_path, agents={"defaults": {"contextBudget": {"clampStrategy": "head"}}})
    result = web_fetch_result(url=URL, content=_page())
    path = PATHS[0]
    with proxy_app(tmp_path, config) as (client, fake):
        fake.answer_json(REPLIES[path])
        r = client.post(path, json=_conversation(path, 1, result))
        text = _web_text(orjson.loads(fake.last.body or b""), path)
        report = _entry(client, r.headers["x-context-budget-request-id"])
    assert FERRY not in text and "[...truncated by ctxbudget: kept " in text
    (segment,) = [s for s in report["segments"] if s["kind"] == "web_fetch"]
    assert segment["strategy"] == "head"


def test_the_report_names_the_strategy_of_each_segment(tmp_path: Path) -> None:
    result = web_fetch_result(url=URL, content=_page())
    path = PATHS[0]
    with proxy_app(tmp_path) as (client, fake):
        fake.answer_json(REPLIES[path])
        r = client.post(path, json=_conversation(path, 1, result))
        report = _entry(client, r.headers["x-context-budget-request-id"])
        text = client.get("/context/budget?format=text").text
    (segment,) = [s for s in report["segments"] if s["kind"] == "web_fetch"]
    assert (segment["action"], segment["strategy"]) == ("clamped", "query")
    assert "clamped by query" in text


def _entry(client: Any, request_id: str) -> dict[str, Any]:
    found: dict[str, Any] = client.get(f"/context/budget/requests/{request_id}").json()
    return found


def _failing_log() -> str:
    lines = [f"tests/test_{i:04d}.py::test_it PASSED" for i in range(1500)]
    lines[700:700] = [
        "Traceback (most recent call last):",
        '  File "/w/app/billing.py", line 88, in charge',
        "    total = invoice.amount / invoice.quantity",
        "ZeroDivisionError: division by zero",
    ]
    return "\n".join(lines) + "\n===== 1 failed, 1499 passed in 12.3s =====\n"


def test_a_failing_command_keeps_its_traceback_from_the_middle(tmp_path: Path) -> None:
    body = claude_code_request(
        prompt="Run the tests and tell me why billing fails",
        turns=[("Bash", {"command": "pytest -q tests/"}, _failing_log())],
    )
    with proxy_app(tmp_path) as (client, fake):
        fake.answer_json(REPLIES["/v1/messages"])
        r = client.post("/v1/messages?beta=true", json=body)
        assert r.status_code == 200, r.text
        sent = orjson.loads(fake.last.body or b"")
    output = sent["messages"][-1]["content"][0]["content"]
    assert "ZeroDivisionError: division by zero" in output
    assert "Traceback (most recent call last):" in output
    assert output.endswith("===== 1 failed, 1499 passed in 12.3s =====\n")  # how it ended
    assert "; run it again, narrower, for the rest...]" in output
    assert utf16_len(output) <= 16_000


def test_claude_codes_webfetch_page_keeps_what_its_prompt_asks(tmp_path: Path) -> None:
    body = summariser_request(_page(), prompt="When does the ferry to Arran leave on Sundays?")
    with proxy_app(tmp_path) as (client, fake):
        fake.answer_json(REPLIES["/v1/messages"])
        assert client.post("/v1/messages?beta=true", json=body).status_code == 200
        sent = orjson.loads(fake.last.body or b"")
    text = sent["messages"][0]["content"][0]["text"]
    assert FERRY in text and "[...skipped chars " in text
    assert text.startswith("\nWeb page content:\n---\n# Island travel guide")
    assert "When does the ferry to Arran leave on Sundays?\n\nProvide a concise" in text


def test_a_bad_strategy_is_refused_naming_the_choices(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"agents": {"defaults": {"contextBudget": {"clampStrategy": "x"}}}}))
    with pytest.raises(ConfigError, match="agents.defaults.contextBudget.clampStrategy"):
        load_config(path, env={}, overrides={})


def _pasted_question(chars: int) -> str:
    """A user turn of distinct short words: every one a question term."""
    words = (f"{a}{b}{c}" for a in "abcdefghij" for b in "klmnopqrst" for c in "uvwxyzabcd")
    return " ".join(itertools.islice(itertools.cycle(words), chars // 4))[:chars]


def test_a_pasted_megabyte_question_costs_the_event_loop_no_more_than_a_short_one(
    tmp_path: Path,
) -> None:
    # The question keeps 4,000 chars of the user's turn: ~1,000 distinct terms, each of which
    # was searched through the whole page (800 ms per 100 KB: a 300 KB page held the event
    # loop ~2.5 s, under the offload threshold). Now a question searches its first terms only.
    def body(title: str, ask: str) -> dict[str, Any]:
        page = f"# {title}\n\n" + "".join(
            f"Note {i} on the {'abcdefghij'[i % 10]}kv road: the quick brown fox jumps over "
            f"the lazy dog near the river bank.\n\n"
            for i in range(3_000)
        )
        sent = _conversation(PATHS[0], 1, web_fetch_result(url=URL, content=page))
        sent["messages"][1]["content"] = ask
        return sent

    times = {}
    with proxy_app(tmp_path) as (client, fake):
        fake.answer_json(REPLIES[PATHS[0]])
        runs = (("warm", ASK_FERRY), ("short", ASK_FERRY), ("pasted", _pasted_question(500_000)))
        for name, ask in runs:  # a page of its own each: no clamp result is found cached
            sent = orjson.dumps(body(name, ask))
            assert len(sent) < 1_000_000  # under the offload threshold: on the event loop
            start = time.perf_counter()
            r = client.post(PATHS[0], content=sent, headers={"content-type": "application/json"})
            times[name] = time.perf_counter() - start
            assert r.status_code == 200, r.text
    # 1.4 s more before; one request each, so room for a busy machine
    assert times["pasted"] < times["short"] + 0.6, times
