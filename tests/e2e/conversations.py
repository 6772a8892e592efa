"""Many conversations of real agents for the holdout's end-to-end tests (issue 32): the five
recorded sessions (`bench/sessions`: Claude Code, Codex, OpenClaw on each format) cut to
different lengths and made into separate conversations, as new sessions of the same agents
would be (each its own session id, its first task stamped with its own number), replayed to
real servers in front of the billing stand-in."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import httpx

from tests.e2e.server import ProxyServer
from tests.replay import HOP_BY_HOP, Recorded, Schedule, recorded
from tests.standin import StandIn

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

    @property
    def turns(self) -> int:
        """The user's turns: each task starts with one, the tool loop after it is not."""
        return len({r.task for r in self.requests})

    @property
    def tool_results(self) -> int:
        """The tool results its last request holds (one per tool call made so far)."""
        last = self.requests[-1]
        body = last.json
        if last.path == "/v1/chat/completions":
            return sum(m.get("role") == "tool" for m in body["messages"])
        if last.path == "/v1/messages":
            return sum(
                b.get("type") == "tool_result"
                for m in body["messages"]
                if isinstance(m.get("content"), list)
                for b in m["content"]
            )
        return sum(str(item.get("type", "")).endswith("_output") for item in body["input"])


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


def workload() -> list[Conversation]:
    """`CONVERSATIONS` conversations, the agents in turn, each of 2-12 requests."""
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


def replay(
    servers: list[ProxyServer] | list[str],
    standin: StandIn,
    advance: Callable[[float], object] | None = None,
    *,
    between: float = 30.0,
    schedule: Schedule = Schedule(),  # noqa: B008 - frozen: one default is safe to share
) -> list[Sent]:
    """Send every conversation of `workload()`, one after another, each request to the next
    of `servers` (as a load balancer would); before each, the clocks move on as a
    `Schedule` says (`between` seconds before a conversation's first request): the
    stand-in's, and by `advance` the servers' (`tests.simclock`). A server may be given as
    a root URL (the stand-in's own: the conversations sent direct)."""
    roots = [s if isinstance(s, str) else s.root for s in servers]
    sent: list[Sent] = []
    with httpx.Client(timeout=120) as http:
        for conversation in workload():
            requests = list(conversation.requests)
            for j, (wait, r) in enumerate(zip(schedule.waits(requests), requests, strict=True)):
                standin.clock.advance(wait or between)
                if advance is not None:
                    advance(wait or between)
                root = roots[(conversation.number + j) % len(roots)]
                tag = f"{conversation.number}-{j}"
                billed = len(standin.bills)
                got = http.request(
                    r.method,
                    root + r.target,
                    headers={**r.headers, TAG: tag},
                    content=r.body,
                )
                assert got.status_code == 200, (tag, got.text[:500])
                (upstream,) = [x.body for x in standin.received if x.headers.get(TAG) == tag]
                (bill,) = standin.bills[billed:]  # the provider's bill for this request alone
                assert bill.usd is not None, bill
                sent.append(
                    Sent(
                        conversation.number,
                        r.body,
                        upstream,
                        got.headers.get(ARM),
                        int(got.headers.get("x-context-budget-clamped", 0)),
                        bill.usd,
                    )
                )
            standin.received.clear()  # found by tag: keep the search short
    return sent


def settled(server: ProxyServer, requests: int) -> dict[str, Any]:
    """The report once every request is written (the writer thread batches them)."""
    report: dict[str, Any] = {}
    for _ in range(100):
        report = server.report()
        arms = (report.get("holdout") or {}).get("arms") or {}
        if sum(a["requests"] for a in arms.values()) >= requests:
            return report
        time.sleep(0.1)
    return report
