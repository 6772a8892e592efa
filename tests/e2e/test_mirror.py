"""The cache mirror through the real server (issue 31): a recorded OpenClaw session with a
1-hour cache that never goes cold, under `pays`, replayed to the billing stand-in. The
report's `withoutCtxbudgetUsd` must be what the same session sent direct is billed (it once
booked ctxbudget's own cache busts as if the direct stream had busted too: $6.74 for a $2.66
bill), and each request's record says how far the mirror was off (`mirrorDrift`)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.server import serve, standin_config
from tests.replay import Schedule, Session, recorded, replay
from tests.simclock import ClockFile
from tests.standin import StandIn
from tests.workload import WorkingModel

WARM = Schedule(burst=60.0, gaps=(60.0,))
"""A request a minute: the cache never expires."""


def _one_hour(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: {"type": "ephemeral", "ttl": "1h"} if k == "cache_control" else _one_hour(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_one_hour(v) for v in value]
    return value


def _hour_session(session: Session) -> Session:
    requests = [replace(r, body=json.dumps(_one_hour(r.json)).encode()) for r in session.requests]
    return Session(session.meta, requests)


@pytest.mark.parametrize("hour", [True, False], ids=["1h", "5m"])
def test_without_ctxbudget_is_the_direct_bill_on_an_always_warm_session(
    tmp_path: Path, standin: StandIn, hour: bool
) -> None:
    [session] = recorded(["openclaw-messages"])
    if hour:
        session = _hour_session(session)
    standin.planner = WorkingModel("/home/agent/work", "http://127.0.0.1:8080")
    replay(session, standin.root, standin.clock.advance, WARM)
    direct = standin.bill()["usd"]

    standin.reset()
    standin.planner = WorkingModel("/home/agent/work", "http://127.0.0.1:8080")
    clock = ClockFile(tmp_path / "clock")
    config = standin_config(tmp_path, standin)
    config["report"]["recentRequests"] = 1000
    config["agents"]["defaults"]["contextPruning"] = {"mode": "pays"}
    with serve(tmp_path, config, clock=clock.path) as server:

        def advance(seconds: float) -> None:
            standin.clock.advance(seconds)
            clock.advance(seconds)

        replies = replay(session, server.root, advance, WARM)
        report = httpx.get(f"{server.root}/context/budget", timeout=60).json()
        metrics = httpx.get(f"{server.root}/metrics", timeout=60).text
    assert {r.status for r in replies} == {200}
    bill = standin.bill()
    [got] = report["sessions"]
    assert got["costUsd"] == pytest.approx(bill["usd"], rel=1e-9)  # the bill, to the token
    assert got["withoutCtxbudgetUsd"] == pytest.approx(direct, rel=0.02), (got, direct)
    # pruning never costs the session money: its warm prunes are priced on the mirror
    assert bill["usd"] <= direct, (bill["usd"], direct)
    assert got.get("pruningPaused") is None, got  # a session in the black keeps pruning
    drifts = [r["mirrorDrift"] for r in report["recent"]]
    assert all(isinstance(d, int) for d in drifts)
    # the mirror knows the provider's cache: off only by its token estimate (bytes scaled by
    # the previous answer's tokens a byte), never by a whole entry it thought was there
    assert sum(abs(d) for d in drifts) <= 0.03 * bill["tokens"]["cache_read"], drifts
    assert max(abs(d) for d in drifts) < 4096, drifts
    less = sum(-d for d in drifts if d < 0)
    assert f'ctxbudget_mirror_drift_tokens_total{{direction="less"}} {float(less)}' in metrics
