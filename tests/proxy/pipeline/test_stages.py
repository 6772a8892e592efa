"""The request pipeline in-process: the real app and stores, a fake upstream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from ctxbudget.caps import ClampResult
from ctxbudget.proxy.errors import UpstreamError
from tests.e2e.checks import check_received
from tests.fakes import chat_chunks, chat_completion
from tests.inproc import UPSTREAM, config_for, proxy_app, state_of
from tests.openclaw import openclaw_request

CAPS = {"bootstrap": 8000, "memory": 2500, "web_fetch": 8000}


def _report(client: Any) -> dict[str, Any]:
    r = client.get("/context/budget")
    assert r.status_code == 200
    data: dict[str, Any] = r.json()
    return data


def test_budget_on_clamps_every_kind_and_says_so(tmp_path: Path) -> None:
    body = openclaw_request(stream=False)
    with proxy_app(tmp_path) as (client, fake):
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200
        assert r.json() == chat_completion()
        sent = fake.last
        assert sent.url == f"{UPSTREAM}/chat/completions"
        clamped = check_received(body, sent.json, **CAPS)
        assert clamped == {"bootstrap": 1, "memory": 2, "web_fetch": 1}
        assert r.headers["x-context-budget-enabled"] == "true"
        assert r.headers["x-context-budget-clamped"] == "4"
        assert int(r.headers["x-context-budget-saved-chars"]) > 20_000
        assert int(r.headers["x-context-budget-saved-tokens"]) > 3_000
        record = client.get(f"/context/budget/requests/{r.headers['x-context-budget-request-id']}")
        entry = record.json()
        assert entry["wire"] == "chat"
        assert entry["clamped"] == 4
        assert entry["savedChars"] == int(r.headers["x-context-budget-saved-chars"])
        assert entry["status"] == 200


def test_budget_off_forwards_the_clients_bytes_and_reports_would_clamp(tmp_path: Path) -> None:
    raw = json.dumps(openclaw_request(stream=False), indent=1).encode()
    config = config_for(tmp_path, agents={"defaults": {"contextBudget": {"enabled": False}}})
    with proxy_app(tmp_path, config) as (client, fake):
        r = client.post(
            "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
        )
        assert r.status_code == 200
        assert fake.last.body == raw  # byte for byte, whitespace included
        assert r.headers["x-context-budget-enabled"] == "false"
        assert r.headers["x-context-budget-clamped"] == "0"
        assert r.headers["x-context-budget-would-clamp"] == "4"
        assert int(r.headers["x-context-budget-would-save-tokens"]) > 3_000
        totals = _report(client)["totals"]
        assert totals["wouldClamp"] == 4 and totals["clamped"] == 0


def test_header_turns_the_budget_off_for_one_request(tmp_path: Path) -> None:
    body = openclaw_request(stream=False)
    with proxy_app(tmp_path) as (client, fake):
        r = client.post("/v1/chat/completions", json=body, headers={"x-context-budget": "off"})
        assert r.headers["x-context-budget-enabled"] == "false"
        assert fake.last.json == body
        r = client.post("/v1/chat/completions", json=body, headers={"x-context-budget": "maybe"})
        assert r.status_code == 400
        assert r.json()["error"]["message"] == (
            "header x-context-budget must be 'on' or 'off', got 'maybe'"
        )
        assert len(fake.sent) == 1


def test_stream_is_relayed_chunk_for_chunk_and_recorded(tmp_path: Path) -> None:
    chunks = chat_chunks("one two three", usage=True)
    with proxy_app(tmp_path) as (client, fake):
        fake.answer_sse(chunks)
        r = client.post("/v1/chat/completions", json=openclaw_request(stream=True))
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/event-stream"
        assert r.content == b"".join(chunks)
        assert fake.replies[-1].released and not fake.replies[-1].closed
        recent = _report(client)["recent"][0]
        assert recent["stream"] is True and recent["status"] == 200


def test_a_stream_that_breaks_ends_with_an_error_event_and_is_recorded(tmp_path: Path) -> None:
    chunks = chat_chunks("one two")
    with proxy_app(tmp_path) as (client, fake):
        fake.answer_sse(chunks[:2], broken=True)
        r = client.post("/v1/chat/completions", json=openclaw_request(stream=True))
        assert r.content.startswith(b"".join(chunks[:2]))
        last = r.content[len(b"".join(chunks[:2])) :]
        assert last.startswith(b"data: ") and last.endswith(b"\n\n")
        error = orjson.loads(last[len(b"data: ") :])["error"]
        assert error["message"] == (
            "upstream stream broke: ConnectionResetError: connection reset by peer"
        )
        assert fake.replies[-1].closed
        recent = _report(client)["recent"][0]
        assert recent["status"] == 502
        assert recent["upstreamError"].startswith("upstream stream broke")


def test_upstream_errors_keep_their_status_and_carry_the_budget_headers(tmp_path: Path) -> None:
    with proxy_app(tmp_path) as (client, fake):
        fake.fail(
            UpstreamError(
                "rate limited", status=429, code="rate_limit", headers={"retry-after": "7"}
            )
        )
        r = client.post("/v1/chat/completions", json=openclaw_request(stream=False))
        assert r.status_code == 429
        assert r.headers["retry-after"] == "7"
        assert r.headers["x-context-budget-clamped"] == "4"
        assert r.json()["error"]["message"] == "rate limited"
        totals = _report(client)["totals"]
        assert totals["upstreamErrors"] == 1


def test_bad_bodies_get_400_or_413_and_nothing_is_forwarded(tmp_path: Path) -> None:
    config = config_for(tmp_path, proxy={"maxBodyBytes": 2048})
    with proxy_app(tmp_path, config) as (client, fake):
        cases = [
            (b"{not json", 400, "request body is not valid JSON"),
            (b"[]", 400, "request body must be a JSON object, got list"),
            (b'{"model": "m"}', 400, "'messages' is required"),
            (b'{"messages": {}}', 400, "'messages' must be a list of chat messages, got object"),
            (b'{"model": 5, "messages": []}', 400, "'model' must be a string, got integer"),
            (
                b'{"messages": ["' + b"x" * 4096 + b'"]}',
                413,
                "over proxy.maxBodyBytes (2,048 bytes)",
            ),
        ]
        for raw, status, message in cases:
            r = client.post("/v1/chat/completions", content=raw)
            assert r.status_code == status, raw[:40]
            assert message in r.json()["error"]["message"]
            assert r.json()["error"]["type"] == "invalid_request_error"
        assert fake.sent == []


def _broken_clamp(
    request: dict[str, Any], caps: Any, *, tools: Any = None, memo: Any = None
) -> ClampResult:
    raise RuntimeError("boom in a clamp")


def test_a_clamp_that_fails_forwards_the_request_untouched(tmp_path: Path) -> None:
    body = openclaw_request(stream=False)
    with proxy_app(tmp_path, clamp=_broken_clamp) as (client, fake):
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200
        assert r.headers["x-context-budget-clamp-error"] == "forwarded-untouched"
        assert fake.last.json == body
        report = _report(client)
    assert report["totals"]["clampErrors"] == 1
    assert report["recent"][0]["clampError"] == "RuntimeError: boom in a clamp"


def test_a_clamp_that_fails_refuses_the_request_when_fail_closed(tmp_path: Path) -> None:
    config = config_for(tmp_path, agents={"defaults": {"contextBudget": {"failClosed": True}}})
    with proxy_app(tmp_path, config, clamp=_broken_clamp) as (client, fake):
        r = client.post("/v1/chat/completions", json=openclaw_request(stream=False))
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "clamp_failed"
    assert "failClosed is true, so nothing was sent upstream" in r.json()["error"]["message"]
    assert fake.sent == []


@pytest.mark.parametrize("stream", [False, True])
def test_the_chat_command_is_answered_by_the_proxy(tmp_path: Path, stream: bool) -> None:
    with proxy_app(tmp_path) as (client, fake):
        client.post("/v1/chat/completions", json=openclaw_request(stream=False))
        body = {
            "model": "m",
            "stream": stream,
            "messages": [{"role": "user", "content": "[Sun 2026-11-22 11:28 UTC] /ctxbudget"}],
        }
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200
        assert r.headers["x-context-budget-command"] == "context-budget"
        assert len(fake.sent) == 1  # only the first request went upstream
        if stream:
            events = [e for e in r.text.split("\n\n") if e]
            assert events[-1] == "data: [DONE]"
            text = "".join(
                orjson.loads(e[6:])["choices"][0]["delta"].get("content", "") for e in events[:-1]
            )
        else:
            text = r.json()["choices"][0]["message"]["content"]
        assert "Context budget: ON" in text
        assert "1 request" in text


def test_proxy_keys_guard_the_route_and_never_reach_the_upstream(tmp_path: Path) -> None:
    env = {"CTXBUDGET_PROXY_KEYS": "alice=sk-alice"}
    with proxy_app(tmp_path, env=env) as (client, fake):
        r = client.post("/v1/chat/completions", json=openclaw_request(stream=False))
        assert r.status_code == 401
        assert "missing or unknown proxy key" in r.json()["error"]["message"]
        ok = client.post(
            "/v1/chat/completions",
            json=openclaw_request(stream=False),
            headers={"authorization": "Bearer sk-alice"},
        )
        assert ok.status_code == 200
        assert len(fake.sent) == 1
        assert "authorization" not in {k.lower() for k in fake.last.headers}


def test_client_headers_go_upstream_but_ours_and_hop_by_hop_do_not(tmp_path: Path) -> None:
    with proxy_app(tmp_path) as (client, fake):
        client.post(
            "/v1/chat/completions",
            json=openclaw_request(stream=False),
            headers={
                "authorization": "Bearer sk-provider",
                "x-custom": "kept",
                "x-context-budget-agent": "main",
                "connection": "keep-alive",
            },
        )
    headers = {k.lower(): v for k, v in fake.last.headers.items()}
    assert headers["authorization"] == "Bearer sk-provider"
    assert headers["x-custom"] == "kept"
    assert "x-context-budget-agent" not in headers and "connection" not in headers


def test_memories_are_placed_in_the_last_user_message(tmp_path: Path) -> None:
    with proxy_app(tmp_path) as (client, fake):
        added = client.post(
            "/v1/memories", json={"text": "Deploys happen on Tuesdays", "category": "fact"}
        )
        assert added.status_code == 201
        body = {
            "model": "gpt-4o",
            "messages": [
                {"role": "system", "content": "You are helpful."},
                {"role": "user", "content": "when do deploys happen?"},
            ],
        }
        r = client.post("/v1/chat/completions", json=body)
        assert r.headers["x-context-budget-memories"] == "1"
        sent = fake.last.json["messages"]
        assert sent[0] == body["messages"][0]  # the cached prefix is untouched
        assert sent[1]["content"].startswith("when do deploys happen?\n\nUser context:\n")
        assert "- Fact: Deploys happen on Tuesdays (today, you told me)" in sent[1]["content"]
        entry = _report(client)["recent"][0]
        assert entry["memories"] == 1
        assert entry["memory"]["injected"] == 1
        assert entry["memory"]["memories"][0]["id"] == added.json()["memory"]["id"]


def test_the_report_store_gets_one_record_per_request(tmp_path: Path) -> None:
    with proxy_app(tmp_path) as (client, fake):
        for _ in range(3):
            client.post("/v1/chat/completions", json=openclaw_request(stream=False))
        state = state_of(client)
        state.reports.flush()
        assert state.reports.summary(recent=10)["totals"]["requests"] == 3


def test_a_huge_json_answer_passes_through_without_being_held(tmp_path: Path) -> None:
    from ctxbudget.proxy.pipeline.relay import BUFFER_BYTES

    piece = b" " * (1 << 20)
    chunks = [b'{"id": "big", "pad": "'] + [piece] * 10 + [b'"}']
    assert sum(map(len, chunks)) > BUFFER_BYTES
    with proxy_app(tmp_path) as (client, fake):
        fake._answer = (200, {"content-type": "application/json"}, chunks, False)
        r = client.post("/v1/chat/completions", json=openclaw_request(stream=False))
        assert r.status_code == 200
        assert r.content == b"".join(chunks)
        assert "content-length" not in r.headers  # relayed as it came, not held whole
        assert fake.replies[-1].released
        fake.answer_json(chat_completion())
        small = client.post("/v1/chat/completions", json=openclaw_request(stream=False))
        assert small.headers["content-length"] == str(len(small.content))
        recent = _report(client)["recent"][1]
    assert recent["status"] == 200 and recent["upstreamError"] is None


def test_a_json_answer_that_breaks_is_a_502(tmp_path: Path) -> None:
    with proxy_app(tmp_path) as (client, fake):
        fake._answer = (200, {"content-type": "application/json"}, [b'{"id": '], True)
        r = client.post("/v1/chat/completions", json=openclaw_request(stream=False))
        assert r.status_code == 502
        assert r.json()["error"]["message"].startswith("upstream connection broke while answering")
        assert fake.replies[-1].closed
        assert _report(client)["recent"][0]["status"] == 502


def test_memories_have_their_own_switch_apart_from_the_caps(tmp_path: Path) -> None:
    body = {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "when do deploys happen?"}],
    }
    with proxy_app(tmp_path) as (client, fake):
        client.post("/v1/memories", json={"text": "Deploys happen on Tuesdays"})
        caps_off = client.post(
            "/v1/chat/completions", json=body, headers={"x-context-budget": "off"}
        )
        assert caps_off.headers["x-context-budget-memories"] == "1"  # caps off, memories on
        skipped = client.post(
            "/v1/chat/completions", json=body, headers={"x-context-budget-memories": "off"}
        )
        assert skipped.headers["x-context-budget-memories"] == "0"
        assert fake.last.json == body  # byte for byte: nothing clamped, nothing injected
        bad = client.post(
            "/v1/chat/completions", json=body, headers={"x-context-budget-memories": "never"}
        )
    assert bad.status_code == 400
    assert bad.json()["error"]["message"] == (
        "header x-context-budget-memories must be 'on' or 'off', got 'never'"
    )
