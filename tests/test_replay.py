"""The recorded sessions the pruning bench replays (bench/sessions), and its schedule."""

from __future__ import annotations

import json
import re

from tests.replay import (
    MACHINE,
    MACHINE_ROOTS,
    SESSIONS,
    WORKSPACE,
    Recorded,
    Schedule,
    recorded,
)
from tests.workload import TASKS, WorkingModel

AGENTS = {"openclaw-chat", "openclaw-messages", "openclaw-responses", "claude-code", "codex"}


def _machine_path(text: str) -> re.Match[str] | None:
    # 75 MB of bodies: each is scanned for what any match starts with first (~0.3 s; the
    # rewritten workspace's own paths set aside), and only a body holding one goes through
    # the regex (~2.5 s for all of them)
    probe = text.replace(WORKSPACE, "")
    return MACHINE.search(text) if any(n in probe for n in MACHINE_ROOTS) else None


def test_each_agent_has_a_long_recorded_session_without_machine_paths() -> None:
    sessions = {s.name: s for s in recorded()}
    assert set(sessions) == AGENTS
    assert sum(p.stat().st_size for p in SESSIONS.glob("*.jsonl.xz")) < 2_000_000
    for name, session in sessions.items():
        meta = session.meta
        assert meta["toolTurns"] >= 40, name
        assert meta["requests"] == len(session.requests) >= meta["toolTurns"] + len(TASKS)
        assert "notes" not in meta, meta["notes"]  # every task ran, no machine path left
        assert {r.path for r in session.requests} == {meta["route"]}
        tasks = [r.task for r in session.requests]
        assert tasks == sorted(tasks) and set(tasks) == set(range(1, len(TASKS) + 1)), name
        for r in session.requests:
            text = r.body.decode() + json.dumps(r.headers)
            assert not _machine_path(text), (name, _machine_path(text))
            assert "host" not in r.headers and r.json["model"] == meta["model"]
        assert WORKSPACE in session.requests[-1].body.decode()  # paths were rewritten


def test_the_working_model_answers_a_recorded_request_with_its_next_step() -> None:
    """What the replay relies on: the planner finds the step from the request alone."""
    model = WorkingModel(WORKSPACE, "http://127.0.0.1:8080")
    [session] = recorded(["openclaw-messages"])
    first, after_two = session.requests[0], session.requests[2]
    assert model("messages", first.json, first.json["messages"]).call == (
        "exec",
        {"command": "ls -la", "title": "Let me look at the workspace first"},
    )
    turn = model("messages", after_two.json, after_two.json["messages"])
    assert turn.call is not None and turn.call[0] == "exec"
    assert turn.call[1]["command"].startswith("find json5")
    last = session.requests[-1]
    assert model("messages", last.json, last.json["messages"]).call is None  # the answer


def test_schedule_puts_the_gaps_between_tasks() -> None:
    def request(task: int | None) -> Recorded:
        return Recorded(task, "POST", "/v1/messages", "", {}, b"{}")

    tasks = [1, 1, 2, 2, 2, 3, 4, 5, 5]
    waits = Schedule(burst=8.0, gaps=(120.0, 600.0)).waits([request(t) for t in tasks])
    assert waits == [0.0, 8.0, 120.0, 8.0, 8.0, 600.0, 120.0, 600.0, 8.0]
