"""Anthropic Messages and OpenAI Responses through the whole pipeline, in-process: the same
product as chat completions — clamps, headers, memories, report, command, errors — in each
client's own format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from ctxbudget.proxy.errors import UpstreamError
from ctxbudget.proxy.upstream import litellm as litellm_route
from tests.inproc import config_for, proxy_app, state_of
from tests.openclaw import INTERNAL_CONTEXT, system_prompt, web_fetch_result

ANTHROPIC = "http://anthropic.test"
PAGE = "A paragraph of a long fetched page. " * 900
MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-x",
    "content": [{"type": "text", "text": "hi"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 10, "output_tokens": 1},
}


def config(tmp_path: Path, **proxy: Any) -> dict[str, Any]:
    anthropic = {"baseUrl": ANTHROPIC, "apiKeyEnv": None}
    return config_for(tmp_path, proxy={"anthropic": anthropic, **proxy})


def messages_body(**more: Any) -> dict[str, Any]:
    return {
        "model": "claude-x",
        "max_tokens": 100,
        "system": [
            {"type": "text", "text": system_prompt(), "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [
            {"role": "user", "content": "Fetch it"},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "tu1",
                        "name": "web_fetch",
                        "input": {"url": "https://e.com"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "tu1",
                        "content": web_fetch_result(content=PAGE),
                    }
                ],
            },
            {"role": "user", "content": [{"type": "text", "text": INTERNAL_CONTEXT}]},
        ],
        **more,
    }


def sse(*events: dict[str, Any]) -> list[bytes]:
    return [
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events
    ]


def report(client: Any) -> dict[str, Any]:
    data: dict[str, Any] = client.get("/context/budget").json()
    return data


def test_messages_are_clamped_forwarded_with_their_headers_and_reported(tmp_path: Path) -> None:
    with proxy_app(tmp_path, config(tmp_path)) as (client, fake):
        fake.answer_json(MESSAGE)
        r = client.post(
            "/v1/messages?beta=true",
            json=messages_body(),
            headers={
                "x-api-key": "sk-ant-client",
                "anthropic-version": "2023-06-01",
                "anthropic-beta": "b1",
            },
        )
        assert r.status_code == 200 and r.json() == MESSAGE
        sent = fake.last
        assert sent.url == f"{ANTHROPIC}/v1/messages?beta=true"
        assert sent.headers["x-api-key"] == "sk-ant-client"
        assert (
            sent.headers["anthropic-version"] == "2023-06-01"
            and sent.headers["anthropic-beta"] == "b1"
        )
        body = sent.json
        assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
        assert len(body["system"][0]["text"]) < len(system_prompt())
        assert len(body["messages"][2]["content"][0]["content"]) <= 8000 + 2000  # JSON wrapper
        assert r.headers["x-context-budget-clamped"] == "2"
        entry = report(client)["recent"][0]
        assert entry["wire"] == "messages" and entry["clamped"] == 2
        assert entry["route"] == "anthropic"


def test_a_message_stream_is_relayed_event_by_event(tmp_path: Path) -> None:
    events = sse(
        {"type": "message_start", "message": {**MESSAGE, "content": [], "stop_reason": None}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 1},
        },
        {"type": "message_stop"},
    )
    with proxy_app(tmp_path, config(tmp_path)) as (client, fake):
        fake.answer_sse(events)
        r = client.post("/v1/messages", json=messages_body(stream=True))
        assert r.status_code == 200 and r.content == b"".join(events)
        fake.answer_sse(events[:3], broken=True)
        broken = client.post("/v1/messages", json=messages_body(stream=True))
        tail = broken.content.split(b"\n\n")[-2]
        assert tail.startswith(b"event: error\ndata: ")
        assert orjson.loads(tail.split(b"data: ")[1])["type"] == "error"


def test_budget_off_sends_the_clients_bytes(tmp_path: Path) -> None:
    raw = orjson.dumps(messages_body())
    with proxy_app(tmp_path, config(tmp_path)) as (client, fake):
        fake.answer_json(MESSAGE)
        r = client.post(
            "/v1/messages",
            content=raw,
            headers={"x-context-budget": "off", "content-type": "application/json"},
        )
        assert r.status_code == 200 and fake.last.body == raw
        assert int(report(client)["recent"][0]["wouldSaveChars"]) > 0


def test_count_tokens_counts_the_clamped_body_and_is_not_a_request_in_the_report(
    tmp_path: Path,
) -> None:
    with proxy_app(tmp_path, config(tmp_path)) as (client, fake):
        fake.answer_json({"input_tokens": 1234})
        r = client.post("/v1/messages/count_tokens", json=messages_body())
        assert r.status_code == 200 and r.json() == {"input_tokens": 1234}
        assert fake.last.url == f"{ANTHROPIC}/v1/messages/count_tokens"
        assert len(fake.last.json["system"][0]["text"]) < len(system_prompt())
        assert r.headers["x-context-budget-clamped"] == "2"
        state_of(client).reports.flush()
        assert report(client)["recent"] == []
        # a command-looking last turn is counted, not answered
        fake.answer_json({"input_tokens": 3})
        counted = client.post(
            "/v1/messages/count_tokens",
            json={"model": "m", "messages": [{"role": "user", "content": "/context budget"}]},
        )
        assert counted.json() == {"input_tokens": 3}


def test_memories_are_injected_into_messages_and_responses(tmp_path: Path) -> None:
    with proxy_app(tmp_path, config(tmp_path)) as (client, fake):
        for text in (
            "The user prefers green tea",
            "Standup is at 9:30",
            "Deploys happen on Fridays",
        ):
            assert client.post("/v1/memories", json={"text": text}).status_code == 201
        fake.answer_json(MESSAGE)
        question = {"role": "user", "content": "What tea does the user prefer?"}
        r = client.post(
            "/v1/messages", json={"model": "claude-x", "max_tokens": 9, "messages": [question]}
        )
        assert r.headers["x-context-budget-memories"] != "0"
        assert "green tea" in fake.last.json["messages"][0]["content"].split("User context:")[1]
        fake.answer_json({"id": "resp_1", "object": "response", "output": []})
        r = client.post("/v1/responses", json={"model": "gpt-x", "input": [question]})
        assert r.headers["x-context-budget-memories"] != "0"
        assert "green tea" in fake.last.json["input"][0]["content"].split("User context:")[1]


def test_the_command_is_answered_in_each_format_and_nothing_goes_upstream(tmp_path: Path) -> None:
    with proxy_app(tmp_path, config(tmp_path)) as (client, fake):
        ask = [{"role": "user", "content": "/context budget"}]
        m = client.post(
            "/v1/messages", json={"model": "claude-x", "max_tokens": 9, "messages": ask}
        )
        assert m.json()["type"] == "message" and "ctxbudget" in m.json()["content"][0]["text"]
        streamed = client.post(
            "/v1/messages",
            json={"model": "claude-x", "max_tokens": 9, "stream": True, "messages": ask},
        )
        assert streamed.headers["content-type"].startswith("text/event-stream")
        assert b"event: message_stop" in streamed.content
        r = client.post("/v1/responses", json={"model": "gpt-x", "input": "/ctxbudget json"})
        assert r.json()["object"] == "response"
        assert (
            orjson.loads(r.json()["output"][0]["content"][0]["text"])["object"]
            == "context_budget.report"
        )
        assert fake.sent == []


def test_errors_are_in_the_clients_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A route makes the app import litellm on a thread at start (~5 s of CPU and ~165 MB,
    # which the rest of the run would share the GIL with); the route is refused before it is
    # needed (routes through litellm are the e2e layer's: tests/e2e/test_litellm_route.py).
    monkeypatch.setattr(litellm_route, "preload_litellm", lambda: None)
    with proxy_app(
        tmp_path, config(tmp_path, routes={"claude-x": {"model": "anthropic/claude-x"}})
    ) as (client, fake):
        bad = client.post(
            "/v1/messages", content=b"{nope", headers={"content-type": "application/json"}
        )
        assert bad.status_code == 400
        assert (
            bad.json()["type"] == "error" and bad.json()["error"]["type"] == "invalid_request_error"
        )
        routed = client.post("/v1/messages", json={"model": "claude-x", "messages": []})
        assert routed.status_code == 400
        assert "chat completions only, not messages" in routed.json()["error"]["message"]
        wrong = client.post("/v1/responses", json={"model": "gpt-x", "input": 3})
        assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "input"
        assert fake.sent == []  # nothing half-forwarded
        theirs = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
        fake.fail(UpstreamError("slow down", status=429, body=theirs, headers={"retry-after": "3"}))
        limited = client.post("/v1/messages", json={"model": "m", "messages": []})
        assert limited.status_code == 429 and limited.json() == theirs
        assert limited.headers["retry-after"] == "3"


def test_a_proxy_key_may_come_as_x_api_key_and_never_goes_upstream(tmp_path: Path) -> None:
    env = {"CTXBUDGET_PROXY_KEYS": "alice=ka-1", "AK": "sk-ant-ours"}
    cfg = config_for(tmp_path, proxy={"anthropic": {"baseUrl": ANTHROPIC, "apiKeyEnv": "AK"}})
    with proxy_app(tmp_path, cfg, env=env) as (client, fake):
        fake.answer_json(MESSAGE)
        denied = client.post("/v1/messages", json=messages_body(), headers={"x-api-key": "wrong"})
        assert (
            denied.status_code == 401 and denied.json()["error"]["type"] == "authentication_error"
        )
        ok = client.post("/v1/messages", json=messages_body(), headers={"x-api-key": "ka-1"})
        assert ok.status_code == 200
        assert fake.last.headers["x-api-key"] == "sk-ant-ours"
        assert "ka-1" not in str(fake.last.headers)


def test_a_responses_continuation_is_clamped_with_the_remembered_tool_name(tmp_path: Path) -> None:
    call = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "web_fetch",
        "arguments": '{"url":"https://e.com"}',
    }
    with proxy_app(tmp_path, config(tmp_path)) as (client, fake):
        fake.answer_sse(
            sse(
                {"type": "response.created", "response": {"id": "resp_1"}, "sequence_number": 0},
                {
                    "type": "response.output_item.done",
                    "output_index": 0,
                    "item": call,
                    "sequence_number": 1,
                },
                {
                    "type": "response.completed",
                    "response": {"id": "resp_1", "output": [call]},
                    "sequence_number": 2,
                },
            )
        )
        first = client.post(
            "/v1/responses",
            json={"model": "gpt-x", "input": "fetch", "stream": True, "store": True},
        )
        assert b"response.completed" in first.content
        page = "Not JSON: the page text itself. " * 900
        result = {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": web_fetch_result(content=page),
        }
        fake.answer_json({"id": "resp_2", "object": "response", "output": []})
        r = client.post(
            "/v1/responses",
            json={
                "model": "gpt-x",
                "previous_response_id": "resp_1",
                "input": [result],
                "store": True,
            },
        )
        assert r.status_code == 200 and r.headers["x-context-budget-clamped"] == "1"
        sent = fake.last.json
        assert sent["previous_response_id"] == "resp_1" and len(sent["input"][0]["output"]) < len(
            result["output"]
        )
        entry = report(client)["recent"][0]
        assert entry["wire"] == "responses" and "resp_1" in entry["note"]
        detail = client.get(f"/context/budget/requests/{entry['id']}").json()
        assert "earlier reply" in detail["segments"][0]["note"]


def test_a_deeply_nested_tool_input_does_not_cost_the_clamps(tmp_path: Path) -> None:
    """A tool_use input 300 levels deep is valid JSON the API takes; writing it for the clamp
    view failed (orjson stops at 254) and the whole request went unclamped."""
    body = messages_body()
    body["messages"][1]["content"].append(
        {
            "type": "tool_use",
            "id": "tu2",
            "name": "other",
            "input": {"x": json.loads("[" * 300 + "]" * 300)},
        }
    )
    body["messages"][2]["content"].append(
        {"type": "tool_result", "tool_use_id": "tu2", "content": "ok"}
    )
    with proxy_app(tmp_path, config(tmp_path)) as (client, fake):
        fake.answer_json(MESSAGE)
        r = client.post("/v1/messages", json=body)
    assert r.status_code == 200 and "x-context-budget-clamp-error" not in r.headers
    assert r.headers["x-context-budget-clamped"] == "2"


# -- Claude Code and Codex (issue 21) ------------------------------------------------------


def _claude_turns() -> list[tuple[str, dict[str, Any], Any]]:
    from tests.agents import FILE, LOG

    return [
        ("Read", {"file_path": "/w/big.py"}, FILE),
        ("Bash", {"command": "pytest"}, LOG),
    ]


def test_claude_code_is_clamped_reported_and_flagged_for_inline_mcp_tools(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from tests.agents import BIG_MD, FILE, claude_code_request

    body = claude_code_request(turns=_claude_turns(), mcp_tools=60, deferred=False)
    with proxy_app(tmp_path, config(tmp_path)) as (client, fake):
        fake.answer_json({**MESSAGE, "usage": {"input_tokens": 30_000, "output_tokens": 10}})
        r = client.post(
            "/v1/messages?beta=true",
            json={**body, "stream": False},
            headers={"x-claude-code-session-id": "cc-1"},
        )
        state_of(client).reports.flush()
        data = report(client)
        text = client.get("/context/budget?format=text").text
        page = client.get("/context/budget", headers={"accept": "text/html"}).text
        metrics = client.get("/metrics").text
    assert r.status_code == 200, r.text
    assert r.headers["x-context-budget-clamped"] == "2"
    sent = orjson.loads(fake.last.body)
    assert sent["tools"] == body["tools"]  # 60 inline MCP tools: passed on as they came
    assert len(sent["messages"][0]["content"][0]["text"]) < len(BIG_MD)
    assert sent["messages"][3]["content"][0]["content"] == FILE
    segments = data["recent"][0]["segments"]
    assert [(s["kind"], s["label"], s["action"]) for s in segments] == [
        ("bootstrap", "/w/CLAUDE.md", "clamped"),
        ("tool_output", "Bash toolu_01abcdef", "clamped"),
    ]
    assert data["caps"]["tool_output"]["value"] == 16000
    assert data["totals"]["byKind"]["tool_output"]["clamped"] == 1
    inline = data["recent"][0]["toolsInline"]
    assert inline["count"] == 60 and inline["tokens"] > 5_000
    (session,) = data["sessions"]
    assert session["id"] == "cc-1"
    assert session["toolsInline"] == {**inline, "requests": 1}
    assert "Tool search off: session cc-1 sent 60 MCP tool definitions inline" in text
    assert "ENABLE_TOOL_SEARCH=true" in text and "tool output: 16,000 per result" in text
    assert "id='tools-inline'" in page and "ENABLE_TOOL_SEARCH=true" in page
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics)
        for s in family.samples
    }
    kind = (("action", "clamped"), ("kind", "tool_output"))
    assert samples[("ctxbudget_segments_clamped_total", kind)] == 1


def test_claude_code_with_tool_search_is_not_flagged(tmp_path: Path) -> None:
    from tests.agents import claude_code_request

    body = claude_code_request(mcp_tools=60, deferred=True)
    with proxy_app(tmp_path, config(tmp_path)) as (client, fake):
        fake.answer_json(MESSAGE)
        r = client.post("/v1/messages?beta=true", json={**body, "stream": False})
        state_of(client).reports.flush()
        data = report(client)
        text = client.get("/context/budget?format=text").text
    assert r.status_code == 200
    assert orjson.loads(fake.last.body)["tools"] == body["tools"]  # defer_loading kept
    assert data["recent"][0]["toolsInline"] is None
    assert data["sessions"][0]["toolsInline"] is None and "Tool search off" not in text


def test_a_large_claude_code_body_is_flagged_from_the_offload_process(tmp_path: Path) -> None:
    from tests.agents import claude_code_request
    from tests.inproc import shared_offload

    body = claude_code_request(turns=_claude_turns(), mcp_tools=60, deferred=False)
    with proxy_app(tmp_path, config(tmp_path), offload=shared_offload(0)) as (client, fake):
        fake.answer_json(MESSAGE)
        r = client.post("/v1/messages?beta=true", json={**body, "stream": False})
        state_of(client).reports.flush()
        data = report(client)
    assert r.status_code == 200 and r.headers["x-context-budget-clamped"] == "2"
    assert data["recent"][0]["toolsInline"]["count"] == 60
    assert data["recent"][0]["toolsInline"]["tokens"] > 5_000


def test_ctxbudget_from_claude_code_is_answered_by_the_proxy(tmp_path: Path) -> None:
    from tests.agents import claude_code_request

    body = claude_code_request(prompt="/ctxbudget")
    body["messages"][0]["content"].insert(
        0,
        {
            "type": "text",
            "text": "<system-reminder>\nThe user's message starts with the slash command "
            "/ctxbudget, but no command with that name is available.\n</system-reminder>",
        },
    )
    with proxy_app(tmp_path, config(tmp_path)) as (client, fake):
        r = client.post("/v1/messages?beta=true", json={**body, "stream": False})
    assert r.status_code == 200, r.text
    assert r.headers["x-context-budget-command"] == "context-budget"
    assert "Context budget: ON" in r.json()["content"][0]["text"]
    assert fake.sent == []


def test_codex_agents_md_is_clamped_through_the_pipeline(tmp_path: Path) -> None:
    from tests.agents import codex_request

    body = codex_request()
    answer = {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "output": [],
        "usage": {"input_tokens": 10, "output_tokens": 1, "total_tokens": 11},
    }
    with proxy_app(tmp_path) as (client, fake):
        fake.answer_json(answer)
        r = client.post("/v1/responses", json={**body, "stream": False})
        state_of(client).reports.flush()
        data = report(client)
    assert r.status_code == 200 and r.headers["x-context-budget-clamped"] == "1"
    [segment] = data["recent"][0]["segments"]
    assert (segment["kind"], segment["label"], segment["after"]) == (
        "bootstrap",
        "/w/AGENTS.md",
        8000,
    )
    sent = orjson.loads(fake.last.body)
    assert sent["input"][2] == body["input"][2]
