"""What the garbage collector has to do for a request: nothing the request made waits in a
reference cycle for it (issue 34: the collector's time grew with the conversation)."""

from __future__ import annotations

import gc
import types
from pathlib import Path
from typing import Any

import pytest

from tests.inproc import proxy_app
from tests.openclaw import tool_call

CHAT = {
    "model": "gpt-4o",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "x" * 200_000},
    ],
}
MESSAGES = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 200_000}]}],
}


def _the_servers(found: object) -> bool:
    """Made by the server side of a request (ours, Starlette's, the loop's), not by the test's
    httpx client, whose own request and response make a cycle of their own."""
    if isinstance(found, types.FrameType | types.CoroutineType):
        return True
    module = type(found).__module__
    return module.startswith(("ctxbudget", "starlette", "asyncio", "_asyncio"))


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/chat/completions", CHAT),
        ("/v1/chat/completions", {**CHAT, "stream": True}),
        ("/v1/messages", MESSAGES),
        ("/v1/messages", {**MESSAGES, "stream": True}),
    ],
)
def test_a_request_leaves_nothing_for_the_collector_to_free(
    tmp_path: Path, route: str, body: dict[str, Any]
) -> None:
    """Whatever a request made is freed by reference counting when it ends. The disconnect
    watch made a cycle (its cancelled task's frame held the watch, and the request with its
    body): each request's 200 KB–1 MB body stayed until the next collection, which had to
    walk it."""
    with proxy_app(tmp_path) as (client, _):
        assert client.post(route, json=body).status_code == 200  # first-request caches
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection would free is kept to look at
        try:
            assert client.post(route, json=body).status_code == 200
            client.settle()
            gc.collect()
            left = sorted({type(o).__qualname__ for o in gc.garbage if _the_servers(o)})
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert left == []


def _grown(rounds: int) -> list[dict[str, Any]]:
    """An OpenClaw-like tool loop `rounds` calls long (2 + 2·rounds messages, ~2 KB results)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent. " * 200},
        {"role": "user", "content": "Read the project and fix the failing test."},
    ]
    for n in range(rounds):
        messages += _round(n)
    return messages


def _round(n: int) -> list[dict[str, Any]]:
    """The `n`th call and its result."""
    lines = "\n".join(f"    line {n}.{i}: value = compute({i}, {n})" for i in range(50))
    return [
        tool_call(f"call{n}", "read", {"path": f"src/module_{n}.py"}),
        {"role": "tool", "tool_call_id": f"call{n}", "content": lines},
    ]


def test_a_grown_conversation_runs_the_collector_rarely(tmp_path: Path) -> None:
    """40 requests that each add a call and its result to a 300-message conversation run the
    collector at most once, and never a full collection. Each young collection walks the
    conversation's newest state (lists as long as the conversation): at Python's default
    threshold it ran every ~5 requests, more work a request the longer the conversation."""
    messages = _grown(150)
    runs: list[int] = []

    def seen(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            runs.append(info["generation"])

    with proxy_app(tmp_path) as (client, _):
        body = {"model": "gpt-4o", "messages": messages}
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        gc.collect()  # what the first request left (the worker's first sight of the config)
        gc.callbacks.append(seen)
        try:
            for n in range(150, 190):
                messages += _round(n)
                body = {"model": "gpt-4o", "messages": messages}
                assert client.post("/v1/chat/completions", json=body).status_code == 200
        finally:
            gc.callbacks.remove(seen)
    assert len(runs) <= 1 and 2 not in runs, runs
