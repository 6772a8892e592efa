"""The holdout through the real server (issue 32): many conversations of real agents, of
different lengths, replayed to two `ctxbudget serve` processes on one database in front of
the prompt-caching billing stand-in.

The five recorded sessions (`bench/sessions`: Claude Code, Codex, OpenClaw on each format)
are cut to different lengths and made into separate conversations, as new sessions of the
same agents would be (each its own session id, its first task stamped with its own number).
Each conversation's requests go to the two processes in turn, as behind a load balancer, and
the stand-in bills every request as the provider would. Then:

- every answer names its arm, and the two processes agree on every conversation's arm;
- a held-out conversation's requests reach the provider byte for byte as the client sent
  them; a budget one's are clamped;
- the report's `holdout` has both arms, each costing what the stand-in billed its requests,
  and its measured saving is this run's (the stand-in's cost per request, budget against
  holdout), inside its 95% interval.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from ctxbudget.proxy.report.holdout import MIN_CONVERSATIONS
from tests.e2e.server import ProxyServer, serve, standin_config
from tests.replay import HOP_BY_HOP, Recorded, Schedule, recorded
from tests.standin import StandIn

SHARE = 0.5
"""The largest share the config allows: ~30 conversations a side of 60, past the report's
minimum (`MIN_CONVERSATIONS`) in both arms."""
CONVERSATIONS = 60
LENGTHS = (2, 12)
"""Each conversation's requests, at least and at most (the recordings' first requests are
60-300 KB each: a longer one would cost minutes on a shared machine, not more evidence)."""
ARM = "x-context-budget-arm"
TAG = "x-replay-request"
"""A header each request carries (the proxy passes it on) to find it at the stand-in."""
SESSION_HEADERS = ("x-claude-code-session-id", "session-id")
FIRST_TASK = b"Task 1/5: "


@dataclass(frozen=True)
class Conversation:
    number: int
    agent: str
    requests: tuple[Recorded, ...]


def _own(request: Recorded, number: int) -> Recorded:
    """`request` as conversation `number` sends it: its own session id (Claude Code, Codex)
    and its first task stamped with its number (the same bytes in every request of it)."""
    headers = {
        k: f"{v}-{number}" if k.lower() in SESSION_HEADERS else v
        for k, v in request.headers.items()
        if k.lower() not in HOP_BY_HOP
    }
    assert FIRST_TASK in request.body, "every recording starts with the first task"
    body = request.body.replace(FIRST_TASK, FIRST_TASK + f"(conversation {number}) ".encode(), 1)
    return replace(request, headers=headers, body=body)


def _workload() -> list[Conversation]:
    sessions = recorded()
    assert len(sessions) == 5, "bench/sessions holds the five recorded agents"
    rng = random.Random(32)
    found = []
    for n in range(CONVERSATIONS):
        session = sessions[n % len(sessions)]
        length = rng.randint(*LENGTHS)
        found.append(
            Conversation(n, session.name, tuple(_own(r, n) for r in session.requests[:length]))
        )
    return found


@dataclass
class Sent:
    """One request of the replay: what the client sent, what reached the provider, the arm
    the answer named, and what the provider billed for it."""

    conversation: int
    client: bytes
    upstream: bytes
    arm: str | None
    clamped: int
    usd: float


def _replay(servers: list[ProxyServer], standin: StandIn) -> list[Sent]:
    sent: list[Sent] = []
    schedule = Schedule()
    with httpx.Client(timeout=120) as http:
        for conversation in _workload():
            requests = list(conversation.requests)
            for j, (wait, r) in enumerate(zip(schedule.waits(requests), requests, strict=True)):
                standin.clock.advance(wait or 30.0)  # the next conversation starts later
                server = servers[(conversation.number + j) % len(servers)]
                tag = f"{conversation.number}-{j}"
                billed = len(standin.bills)
                got = http.request(
                    r.method,
                    server.root + r.target,
                    headers={**r.headers, TAG: tag},
                    content=r.body,
                )
                assert got.status_code == 200, (tag, got.text[:500])
                (upstream,) = [
                    x.body for x in standin.received if x.headers.get(TAG) == tag
                ]
                (bill,) = standin.bills[billed:]  # the provider's bill for this request alone
                assert bill.usd is not None, bill
                sent.append(
                    Sent(
                        conversation.number,
                        r.body,
                        upstream,
                        got.headers.get(ARM),
                        int(got.headers["x-context-budget-clamped"]),
                        bill.usd,
                    )
                )
            standin.received.clear()  # found by tag: keep the search short
    return sent


def _settled(server: ProxyServer, requests: int) -> dict[str, Any]:
    """The report once every request is written (the writer thread batches them)."""
    report: dict[str, Any] = {}
    for _ in range(100):
        report = server.report()
        arms = (report.get("holdout") or {}).get("arms") or {}
        if sum(a["requests"] for a in arms.values()) >= requests:
            return report
        import time

        time.sleep(0.1)
    return report


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
    sent = _replay(two, standin)

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
    for server in two:
        found = _settled(server, len(sent))["holdout"]
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
            {"conversations": counts, "requests": requests, "billedUsd": billed,
             "truePct": round(true_pct, 2), "saving": found["saving"]}  # fmt: skip
        )
    )
