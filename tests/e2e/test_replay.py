"""A recorded agent session (bench/sessions) replayed through the real server, with an idle
gap that lets the prompt cache expire: the report's money is the stand-in's bill, which
plays the provider's prompt caching exactly (tests/prompt_cache.py)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.e2e.server import serve, standin_config
from tests.replay import Schedule, recorded, replay
from tests.simclock import ClockFile
from tests.standin import StandIn
from tests.workload import WorkingModel

FIRST = 12
"""Requests replayed: the first task (10 requests) and two of the second."""
SCHEDULE = Schedule(burst=8.0, gaps=(600.0,))
"""10 minutes idle before the second task: every 5-minute cache entry expired."""


@pytest.mark.parametrize("name", ["openclaw-messages", "codex"])
def test_report_equals_the_bill_of_a_replayed_session(
    tmp_path: Path, standin: StandIn, name: str
) -> None:
    [session] = recorded([name])
    standin.planner = WorkingModel("/home/agent/work", "http://127.0.0.1:8080")
    clock = ClockFile(tmp_path / "clock")
    config = standin_config(tmp_path, standin)
    config["report"]["recentRequests"] = 100
    with serve(tmp_path, config, clock=clock.path) as server:

        def advance(seconds: float) -> None:
            standin.clock.advance(seconds)
            clock.advance(seconds)

        replies = replay(session, server.root, advance, SCHEDULE, limit=FIRST)
        report = httpx.get(f"{server.root}/context/budget", timeout=30).json()
        assert server.report()["totals"]["money"] == report["totals"]["money"]
    assert [r.status for r in replies] == [200] * FIRST
    assert clock.offset == 9 * 8 + 600 + 8  # the proxy's clock moved with the stand-in's

    bill = standin.bill()
    lines = bill["lines"]
    assert len(lines) == FIRST
    # warm within the first task; the gap expired everything, the second task starts cold
    assert all(line["cache_read"] > 0 for line in lines[1:10])
    assert lines[10]["cache_read"] == 0 and lines[11]["cache_read"] > 0
    money = report["totals"]["money"]
    tokens = bill["tokens"]
    assert money["usage"] == {
        "input": tokens["input"],
        "cacheRead": tokens["cache_read"],
        "cacheWrite": tokens["cache_write_5m"] + tokens["cache_write_1h"],
        "output": tokens["output"],
    }
    assert money["costUsd"] == pytest.approx(bill["usd"], rel=1e-9)
    # request by request too, oldest first
    records = report["recent"][::-1]
    assert [r["costUsd"] for r in records] == pytest.approx([line["usd"] for line in lines])
