"""The holdout through the app (issue 32, item 1): a share of conversations goes upstream
exactly as the client sent it, each conversation's arm is drawn once and kept in the report's
database (every instance agrees, a later share never moves it), every answer names its arm,
and a request that chooses the budget itself takes its conversation out of the comparison."""

from __future__ import annotations

import json
import queue
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import ctxbudget.proxy.routes.report as report_routes
from ctxbudget.proxy.report.store import ReportStore
from tests.conftest import Backend
from tests.fakes import chat_completion
from tests.inproc import InProcess, config_for, proxy_app, shared_offload, state_of

OUTPUT = "".join(f"line {i}: " + "ok " * 20 + "\n" for i in range(500))  # ~35 KB: clamped


def _conversation(n: int, turns: int = 2) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"[conversation {n}] fix the failing test"},
    ]
    for i in range(turns):
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": "exec", "arguments": '{"cmd": "pytest"}'}}  # fmt: skip
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": f"run {i}\n{OUTPUT}"},
        ]
    return {"model": "gpt-4o", "messages": messages}


def _config(tmp_path: Path, share: float, **more: Any) -> dict[str, Any]:
    budget = {"enabled": True, "holdout": share}
    return config_for(tmp_path, agents={"defaults": {"contextBudget": budget}}, **more)


def _send(client: InProcess, body: bytes, **headers: str) -> tuple[str | None, bytes]:
    """The answer's arm header, and the body that went upstream."""
    r = client.post("/v1/chat/completions", content=body, headers=headers)
    assert r.status_code == 200, r.text
    fake = client.app.state.proxy.upstream
    sent = fake.last.body
    assert sent is not None
    return r.headers.get("x-context-budget-arm"), sent


@pytest.mark.parametrize("large", [False, True], ids=["parsed-here", "offloaded"])
def test_a_held_out_conversation_goes_upstream_as_the_client_sent_it(
    tmp_path: Path, large: bool
) -> None:
    offload = shared_offload(4096) if large else None
    with proxy_app(tmp_path, _config(tmp_path, 0.5), offload=offload) as (client, fake):
        fake.answer_json(chat_completion(model="gpt-4o"))
        arms: dict[int, str | None] = {}
        for n in range(24):
            for turns in (1, 2):  # the arm holds for the conversation's next request
                body = json.dumps(_conversation(n, turns)).encode()
                arm, sent = _send(client, body)
                assert arms.setdefault(n, arm) == arm
                if arm == "holdout":
                    assert sent == body  # byte for byte
                else:
                    assert arm == "budget"
                    assert len(sent) < len(body) - 10_000  # clamped
        assert set(arms.values()) == {"budget", "holdout"}


def test_without_a_holdout_no_answer_names_an_arm(tmp_path: Path) -> None:
    with proxy_app(tmp_path, _config(tmp_path, 0.0)) as (client, fake):
        fake.answer_json(chat_completion(model="gpt-4o"))
        body = json.dumps(_conversation(1)).encode()
        arm, sent = _send(client, body)
        assert arm is None and len(sent) < len(body) - 10_000  # clamped, as before


def test_a_holdout_share_out_of_range_is_refused_with_its_path(tmp_path: Path) -> None:
    from ctxbudget.proxy.config.schema import Config

    with pytest.raises(ValueError, match=r"contextBudget\.holdout|holdout"):
        Config.model_validate({"agents": {"defaults": {"contextBudget": {"holdout": 0.7}}}})


def test_two_instances_on_one_database_agree_on_every_arm_and_a_new_share_moves_none(
    tmp_path: Path, backend: Backend
) -> None:
    extra: dict[str, Any] = {"database": {"url": backend.url}} if backend.url else {}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shared = tmp_path / "report.db"  # both instances' report (SQLite): one file
    config_a = _config(tmp_path, 0.5, **extra)
    config_a["report"]["path"] = str(shared)
    config_b = _config(tmp_path, 0.1, **extra)  # the share changed since: no arm moves
    config_b["report"]["path"] = str(shared)
    bodies = [json.dumps(_conversation(n)).encode() for n in range(30)]
    with (
        proxy_app(tmp_path / "a", config_a, run="a") as (a, fake_a),
        proxy_app(tmp_path / "b", config_b, run="b") as (b, fake_b),
    ):
        fake_a.answer_json(chat_completion(model="gpt-4o"))
        fake_b.answer_json(chat_completion(model="gpt-4o"))
        first = [_send(a, body)[0] for body in bodies]
        second = [_send(b, body)[0] for body in bodies]
        assert first == second
        assert first.count("holdout") >= 5  # drawn at 0.5, kept at 0.1
        # a conversation b meets first is drawn at b's share, and a then agrees
        late = [json.dumps(_conversation(n)).encode() for n in range(100, 130)]
        assert [_send(b, x)[0] for x in late] == [_send(a, x)[0] for x in late]


def test_a_request_that_chooses_takes_its_conversation_out_of_the_comparison(
    tmp_path: Path,
) -> None:
    with proxy_app(tmp_path, _config(tmp_path, 0.5)) as (client, fake):
        fake.answer_json(chat_completion(model="gpt-4o"))
        chose = json.dumps(_conversation(7)).encode()
        arm, sent = _send(client, chose, **{"x-context-budget": "off"})
        assert arm is None and sent == chose  # as asked, and in no arm
        for n in range(20):  # conversation 7 again, without choosing: it stays out
            _send(client, json.dumps(_conversation(n, 1)).encode())
        client.settle()
        rows = state_of(client).reports.holdout_rows()
        chosen = [r for r in rows if r["chosen"]]
        assert len(chosen) == 1 and chosen[0]["requests"] == 2
        assert sum(r["requests"] for r in rows) == 21


def test_each_key_sees_only_its_own_conversations_arms_and_numbers(tmp_path: Path) -> None:
    env = {"CTXBUDGET_PROXY_KEYS": "alice=ka-1,bob=kb-2", "CTXBUDGET_ADMIN_KEY": "adm-1"}
    alice, bob = {"authorization": "Bearer ka-1"}, {"authorization": "Bearer kb-2"}
    with proxy_app(tmp_path, _config(tmp_path, 0.5), env=env) as (client, fake):
        fake.answer_json(chat_completion(model="gpt-4o"))
        for n in range(6):
            _send(client, json.dumps(_conversation(n, 1)).encode(), **alice)
        for n in range(3):
            _send(client, json.dumps(_conversation(n, 1)).encode(), **bob)
        seen = {
            who: client.get("/context/budget", headers=key).json()["holdout"]
            for who, key in (("alice", alice), ("bob", bob))
        }
    for who, count in (("alice", 6), ("bob", 3)):
        arms = seen[who]["arms"]
        assert arms["budget"]["conversations"] + arms["holdout"]["conversations"] == count


def _small_results(n: int, calls: int) -> dict[str, Any]:
    """A conversation's one user turn and `calls` tool results each well under every cap."""
    body = _conversation(n, calls)
    for m in body["messages"]:
        if m["role"] == "tool":
            m["content"] = f"ok {m['tool_call_id']}"
    return body


def test_both_arms_count_every_tool_call_whatever_its_size(tmp_path: Path) -> None:
    # the tool calls a turn are a quality signal compared across arms: they once counted only
    # results a clamp reported (over its cap), so a conversation of small results had none
    with proxy_app(tmp_path, _config(tmp_path, 0.5)) as (client, fake):
        fake.answer_json(chat_completion(model="gpt-4o"))
        for n in range(16):  # the user's turn, then its tool loop
            _send(client, json.dumps(_conversation(n, 0)).encode())
            _send(client, json.dumps(_small_results(n, 3)).encode())
        report = client.get("/context/budget").json()["holdout"]
    for arm in ("budget", "holdout"):
        found = report["arms"][arm]
        assert found["conversations"] > 0, report["arms"]
        assert (found["turnsPerConversation"], found["toolCallsPerTurn"]) == (1, 3), found


def test_a_report_over_many_conversations_never_holds_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The comparison walks every conversation with an arm (a key's new session ids each make
    # one, kept `report.keepDays`): 100,000 took ~1 s, and ran on the event loop, so every
    # other client waited while anyone read the report. It runs in the reading thread now.
    # Shown without a clock: the arms' read and the comparison are each held until /healthz
    # has answered while it waits, which it cannot while the waiting one holds the loop.
    waiting: queue.Queue[threading.Event] = queue.Queue()
    held: list[bool] = []

    def holding(work: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            answered = threading.Event()
            waiting.put(answered)
            held.append(answered.wait(timeout=10))  # on the loop: never, until the timeout
            return work(*args, **kwargs)

        return run

    monkeypatch.setattr(report_routes, "comparison", holding(report_routes.comparison))
    monkeypatch.setattr(ReportStore, "holdout_rows", holding(ReportStore.holdout_rows))
    with proxy_app(tmp_path, _config(tmp_path, 0.2)) as (client, fake):
        fake.answer_json(chat_completion(model="gpt-4o"))
        _send(client, json.dumps(_conversation(0)).encode())
        client.settle()
        now = time.time()
        with sqlite3.connect(tmp_path / "report.db") as db:
            db.executemany(
                "INSERT INTO arms (owner, conversation, arm, drawn, last, requests, priced, "
                "cost_usd, without_usd, turns) VALUES ('default', ?, ?, ?, ?, 2, 2, ?, 0.03, 1)",
                (
                    (f"s{i}", "holdout" if i % 5 == 0 else "budget", now - i, now, 0.01 + i % 7e-3)
                    for i in range(2_000)
                ),
            )
        found: list[Any] = []
        reader = threading.Thread(
            target=lambda: found.append(client.get("/context/budget?format=json").json())
        )
        reader.start()
        for _ in range(2):  # the arms' read, then the comparison
            answered = waiting.get(timeout=10)
            assert client.get("/healthz").status_code == 200
            answered.set()
        reader.join()
    assert held == [True, True], "the report's arms were read or compared on the event loop"
    assert found[0]["holdout"]["arms"]["holdout"]["conversations"] >= 400
