"""The recall stage through the app: which memories a request gets, for which agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.inproc import proxy_app

ORION = "The orion release ships on Friday"
TABS = "Use tabs, not spaces, in Makefiles"


def _ask(client: Any, question: str, *, system: str = "You are helpful.") -> list[int]:
    """Ask `question` (no x-context-budget-agent header); the ids of the memories injected."""
    body = {
        "model": "gpt-4o",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
    }
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200
    recent = client.get("/context/budget").json()["recent"][0]
    memory = recent.get("memory") or {}
    ids = [m["id"] for m in memory.get("memories", [])]
    assert r.headers["x-context-budget-memories"] == str(len(ids))
    return ids


def _add(client: Any, text: str, scope: str = "global") -> int:
    r = client.post("/v1/memories", json={"text": text, "category": "fact", "scope": scope})
    assert r.status_code == 201, r.text
    return int(r.json()["memory"]["id"])


def test_memories_of_the_default_agent_are_injected_without_an_agent_header(
    tmp_path: Path,
) -> None:
    with proxy_app(tmp_path) as (client, _):
        mine = _add(client, ORION, "agent:main")
        _add(client, "The orion release of ops ships on Monday", "agent:ops")
        assert _ask(client, "when does the orion release ship?") == [mine]
        recent = client.get("/context/budget").json()["recent"][0]
        assert recent["memory"]["budget"]["agent"] == "main"  # what the record says, applied


def test_the_agent_openclaw_names_in_its_runtime_line_scopes_recall(tmp_path: Path) -> None:
    with proxy_app(tmp_path) as (client, _):
        _add(client, ORION, "agent:main")
        ops = _add(client, "The orion release of ops ships on Monday", "agent:ops")
        system = "You are a personal assistant.\n## Runtime\nRuntime: agent=ops | host=vm"
        assert _ask(client, "when does the orion release ship?", system=system) == [ops]
        recent = client.get("/context/budget").json()["recent"][0]
        assert recent["memory"]["budget"]["agent"] == "ops"
        # OpenClaw 9.x moves the line into the first user message
        moved = "[Sun 2026-11-22 11:28 UTC] when does the orion release ship?\n\n"
        assert _ask(client, moved + "Runtime: agent=ops | host=vm") == [ops]


def test_a_memory_matching_only_a_stop_word_is_never_injected(tmp_path: Path) -> None:
    with proxy_app(tmp_path) as (client, _):
        orion = _add(client, ORION)
        _add(client, TABS)
        _add(client, "Coffee order: oat milk flat white")
        # deep (a how question): its relevance floor is 0, and "use" matched TABS
        assert _ask(client, "How should I use the release notes for orion?") == [orion]
        assert _ask(client, "what should I use?") == []


def test_a_memory_of_zero_relevance_is_never_injected(tmp_path: Path) -> None:
    with proxy_app(tmp_path) as (client, _):
        orion = _add(client, "The orion project is late by a week")
        for n in range(4):  # "project" in every memory: BM25 gives it no weight (relevance 0)
            _add(client, f"Project note {n}: keep the project wiki current")
        assert _ask(client, "why is the orion project late?") == [orion]
        memories = client.get("/context/budget").json()["recent"][0]["memory"]["memories"]
        assert [m["relevance"] for m in memories] == [100.0]  # 0-100, the best hit 100
