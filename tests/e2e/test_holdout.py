"""The holdout through the real server (issue 32): many conversations of real agents, of
different lengths, replayed to `ctxbudget serve` in front of the prompt-caching billing
stand-in (`tests/e2e/conversations.py`: the five recorded agents cut into 60 conversations
of 2-12 requests).

- Two processes on one database (a SQLite file, a PostgreSQL database), each conversation's
  requests to them in turn as behind a load balancer: every answer names its arm and both
  name the same; a held-out conversation reaches the provider byte for byte as the client
  sent it, a budget one clamped; the report's `holdout` has both arms costing what the
  stand-in billed them, their turns and tool calls, and a saving that is this run's.
- The same conversations sent direct and all through the budget: the population's true
  saving per request, which the holdout's 95% interval must hold.
- Two processes with different shares meeting a conversation at the same moment: they
  agree on its arm (the first writer's).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from ctxbudget.proxy.report.holdout import MIN_CONVERSATIONS
from tests.e2e.conversations import ARM, Sent, replay, settled, workload
from tests.e2e.server import ProxyServer, serve, standin_config
from tests.replay import Recorded
from tests.standin import StandIn

SHARE = 0.5
"""The largest share the config allows: ~30 conversations a side of 60, past the report's
minimum (`MIN_CONVERSATIONS`) in both arms."""


@pytest.fixture(params=["sqlite", "postgres"])
def two(
    request: pytest.FixtureRequest, tmp_path: Path, standin: StandIn
) -> Iterator[list[ProxyServer]]:
    """Two real servers, each with its own folder, on one database: one SQLite file, or one
    PostgreSQL database."""
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    with ExitStack() as stack:
        servers = []
        for name in ("a", "b"):
            folder = tmp_path / name
            folder.mkdir()
            config = standin_config(folder, standin)
            config["agents"]["defaults"]["contextBudget"]["holdout"] = SHARE
            if url is None:
                config["report"]["path"] = str(tmp_path / "report.db")  # the same file
            else:
                config["database"] = {"url": url, "connectTimeoutSeconds": 5}
            servers.append(stack.enter_context(serve(folder, config)))
        yield servers


def test_a_replay_of_many_conversations_measures_the_saving_the_provider_billed(
    two: list[ProxyServer], standin: StandIn
) -> None:
    sent = replay(two, standin)

    # every answer names its arm, and both processes name the same one for a conversation
    assert all(s.arm in ("budget", "holdout") for s in sent), {s.arm for s in sent}
    arms: dict[int, set[str | None]] = {}
    for s in sent:
        arms.setdefault(s.conversation, set()).add(s.arm)
    assert all(len(found) == 1 for found in arms.values()), arms
    arm_of = {n: next(iter(found)) for n, found in arms.items()}
    counts = {a: sum(v == a for v in arm_of.values()) for a in ("budget", "holdout")}
    assert min(counts.values()) >= MIN_CONVERSATIONS, counts

    # held out: upstream byte for byte as the client sent it; budget: clamped
    held = [s for s in sent if s.arm == "holdout"]
    budget = [s for s in sent if s.arm == "budget"]
    assert all(s.upstream == s.client for s in held)
    assert all(s.clamped == 0 for s in held)
    changed = [s for s in budget if s.clamped]
    assert len(changed) > len(budget) // 3, (len(changed), len(budget))
    assert all(len(s.upstream) < len(s.client) for s in changed)
    client_bytes = sum(len(s.client) for s in budget)
    assert sum(len(s.upstream) for s in budget) < 0.9 * client_bytes

    # the report, from either process: both arms, each at what the provider billed
    billed = {a: sum(s.usd for s in sent if s.arm == a) for a in ("budget", "holdout")}
    requests = {a: sum(s.arm == a for s in sent) for a in ("budget", "holdout")}
    true_pct = 100 * (
        1 - (billed["budget"] / requests["budget"]) / (billed["holdout"] / requests["holdout"])
    )
    # the quality signals, per arm: the user's turns, the tool calls in them, and no call
    # made again (a replay sends the recorded requests, whatever was clamped)
    turns = {a: sum(c.turns for c in workload() if arm_of[c.number] == a) for a in counts}
    calls = {a: sum(c.tool_results for c in workload() if arm_of[c.number] == a) for a in counts}
    for server in two:
        found = settled(server, len(sent))["holdout"]
        quality = {
            a: {
                k: found["arms"][a][k]
                for k in ("turnsPerConversation", "toolCallsPerTurn", "rerunsAfterPrune")
            }
            for a in counts
        }
        assert quality == {
            a: {
                "turnsPerConversation": round(turns[a] / counts[a], 2),
                "toolCallsPerTurn": round(calls[a] / turns[a], 2),
                "rerunsAfterPrune": 0,
            }
            for a in counts
        }
        assert found["share"] == SHARE and found["excluded"] == 0
        for a in ("budget", "holdout"):
            got = found["arms"][a]
            assert got["conversations"] == counts[a], (a, got)
            assert got["requests"] == requests[a], (a, got)
            assert abs(got["costUsd"] - billed[a]) < 0.005, (a, got["costUsd"], billed[a])
            assert got["upstreamErrors"] == 0
        saving = found["saving"]
        assert saving["enough"] is True, saving
        assert saving["pct"] == pytest.approx(true_pct, abs=0.06), (saving, true_pct)
        assert saving["low"] <= true_pct <= saving["high"], (saving, true_pct)
        assert saving["estimatedPct"] is not None
    print(
        json.dumps(
            {
                "conversations": counts,
                "requests": requests,
                "billedUsd": billed,
                "truePct": round(true_pct, 2),
                "saving": found["saving"],
            }
        )
    )


def test_the_interval_holds_the_saving_of_the_whole_population(
    tmp_path: Path, standin: StandIn
) -> None:
    """The same 60 conversations three times: half held out (what the report measures), all
    sent direct, all through the budget. The last two are what this population costs without
    and with ctxbudget; the holdout's 95% interval must hold that saving per request."""

    def run(share: float | None, folder: str) -> list[Sent]:
        standin.reset()
        if share is None:
            return replay([standin.root], standin)
        (tmp_path / folder).mkdir()
        config = standin_config(tmp_path / folder, standin)
        config["agents"]["defaults"]["contextBudget"]["holdout"] = share
        with serve(tmp_path / folder, config) as server:
            sent = replay([server], standin)
            report = settled(server, len(sent)) if share else server.report()
            measured.append(report.get("holdout"))
        return sent

    measured: list[dict[str, Any] | None] = []
    held = run(SHARE, "holdout")
    direct, budget = run(None, "direct"), run(0.0, "budget")
    assert len(direct) == len(budget) and all(s.clamped == 0 for s in direct)
    true_pct = 100 * (1 - sum(s.usd for s in budget) / sum(s.usd for s in direct))
    found, no_holdout = measured
    assert no_holdout is None  # a share of 0 measures nothing
    assert found is not None
    saving = found["saving"]
    in_budget = {s.conversation for s in held if s.arm == "budget"}
    arm_pct = 100 * (
        1
        - sum(s.usd for s in budget if s.conversation in in_budget)
        / sum(s.usd for s in direct if s.conversation in in_budget)
    )
    print(
        json.dumps(
            {
                "populationPct": round(true_pct, 2),
                "budgetArmPct": round(arm_pct, 2),
                "saving": saving,
            }
        )
    )
    assert saving["enough"] is True
    assert saving["low"] <= true_pct <= saving["high"], (saving, true_pct)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_two_servers_meeting_a_conversation_at_once_agree_whatever_their_shares(
    request: pytest.FixtureRequest, tmp_path: Path, standin: StandIn, backend: str
) -> None:
    """Each conversation's first request reaches both servers at the same moment, and the
    servers hold different shares (one was changed and not yet the other): the first
    writer's draw is the conversation's arm on both, and stays it."""
    url = request.getfixturevalue("pg_url") if backend == "postgres" else None
    conversations = workload()[:40]
    with ExitStack() as stack:
        servers = []
        for name, share in (("a", 0.5), ("b", 0.1)):
            folder = tmp_path / name
            folder.mkdir()
            config = standin_config(folder, standin)
            config["agents"]["defaults"]["contextBudget"]["holdout"] = share
            if url is None:
                config["report"]["path"] = str(tmp_path / "report.db")
            else:
                config["database"] = {"url": url, "connectTimeoutSeconds": 5}
            servers.append(stack.enter_context(serve(folder, config)))
        http = stack.enter_context(httpx.Client(timeout=120))
        pool = stack.enter_context(ThreadPoolExecutor(2))

        def send(server: ProxyServer, r: Recorded) -> str | None:
            got = http.request(r.method, server.root + r.target, headers=r.headers, content=r.body)
            assert got.status_code == 200, got.text[:500]
            arm: str | None = got.headers.get(ARM)
            return arm

        arms = []
        for c in conversations:
            first, second = c.requests[:2]
            at_once = list(pool.map(send, servers, [first, first]))
            arms.append([*at_once, send(servers[1], second), send(servers[0], second)])
    assert all(len(set(found)) == 1 for found in arms), arms
    assert {found[0] for found in arms} == {"budget", "holdout"}
