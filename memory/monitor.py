"""The budget monitor: usage per request, soft enforcement, and recommendations.

Every recall appends a usage record to the `usage` table of the memory store's database (its
SQLite file, or PostgreSQL: one table, not a JSONL file: it is shared by every worker, proxy
and the CLI, and `analyze` queries it by agent and time). "Tokens loaded" is what recall
wanted to load — every memory that passed the trust pass — so usage over 100% means relevant
memories did not fit the budget:

- >= 75% → info, >= 90% → warning, > 100% → exceeded;
- after an exceeded request, the agent's next request is bumped one complexity tier
  (soft enforcement: a bigger budget next time, never a refused request).

Scopes: `global` memories, and the agent's own (`agent:<name>`) split into `agent_patterns`
(category `pattern`) and `agent_recent` (the rest).
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ctxbudget.memory.budget import BudgetProfile
    from ctxbudget.memory.pg import PgDatabase
    from ctxbudget.memory.sqlite import Database

ORDER = ("specialist-narrow", "specialist-broad", "role-coordinator", "role-architect")


def scope_of(scope: str, category: str) -> str:
    if scope == "global":
        return "global"
    return "agent_patterns" if category == "pattern" else "agent_recent"


@dataclass(frozen=True, kw_only=True)
class Usage:
    """One request's use of its memory budget."""

    ts: float
    owner: str
    agent: str
    budget_profile: str
    retrieval_profile: str
    complexity: str
    budget: int
    tokens_loaded: int
    tokens_injected: int
    per_scope: dict[str, int]

    @property
    def percent(self) -> float:
        return 100.0 * self.tokens_loaded / self.budget if self.budget else 0.0

    @property
    def exceeded(self) -> bool:
        return self.tokens_loaded > self.budget

    @property
    def warnings(self) -> list[str]:
        p = self.percent
        if p > 100:
            return [f"exceeded: {p:.0f}% of {self.budget:,} tokens; next request bumped a tier"]
        if p >= 90:
            return [f"warning: {p:.0f}% of the memory budget"]
        if p >= 75:
            return [f"info: {p:.0f}% of the memory budget"]
        return []

    def to_dict(self) -> dict[str, Any]:
        return {
            "ts": self.ts,
            "owner": self.owner,
            "agent": self.agent,
            "budgetProfile": self.budget_profile,
            "profile": self.retrieval_profile,
            "complexity": self.complexity,
            "budget": self.budget,
            "tokensLoaded": self.tokens_loaded,
            "tokensInjected": self.tokens_injected,
            "usagePercent": round(self.percent, 1),
            "perScope": self.per_scope,
            "exceeded": self.exceeded,
            "warnings": self.warnings,
        }


class Monitor:
    """Usage log and pending tier bumps, in the memory store's database."""

    def __init__(self, db: Database | PgDatabase) -> None:
        self._db = db

    def record(self, usage: Usage) -> None:
        with self._db.transaction() as conn:
            conn.execute(
                "INSERT INTO usage (ts, owner, agent, body) VALUES (?, ?, ?, ?)",
                (usage.ts, usage.owner, usage.agent, json.dumps(usage.to_dict())),
            )
            if usage.exceeded:
                conn.execute(
                    "INSERT INTO bumps (owner, agent) VALUES (?, ?) ON CONFLICT DO NOTHING",
                    (usage.owner, usage.agent),
                )

    def take_bump(self, owner: str, agent: str) -> bool:
        """True (once) when the agent's last request exceeded its budget."""
        cursor = self._db.execute("DELETE FROM bumps WHERE owner = ? AND agent = ?", (owner, agent))
        return cursor.rowcount > 0

    def records(self, *, since: float, owner: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT body FROM usage WHERE ts >= ?"
        args: list[object] = [since]
        if owner is not None:
            sql += " AND owner = ?"
            args.append(owner)
        return [json.loads(r[0]) for r in self._db.fetchall(sql + " ORDER BY ts", args)]


MIN_REQUESTS = 20
"""Fewest requests of one agent that `analyze` recommends from (its confidence is then 0.63).
Below it, a few unusual requests would move a whole profile."""


def analyze(
    records: list[dict[str, Any]],
    profiles: Mapping[str, BudgetProfile],
    *,
    agents: Mapping[str, str] | None = None,
    default_profile: str | None = None,
    min_requests: int = MIN_REQUESTS,
) -> dict[str, Any]:
    """Recommendations per agent, from its requests in `records`.

    Each names the agent, the change (`upgrade`, `downgrade`, `scope-weights`), why, a
    confidence in [0, 1], `sharedWith` (the other agents using the same budget profile) and
    `set`: the config values that make the change, each key with the whole new value of that
    map (`memory.budgets.agents`, `memory.budgets.profiles`), ready to paste. A change never
    touches another agent's budget: when the profile is shared, a scope-weights change gives
    the agent a profile of its own.

    `agents` and `default_profile` are `memory.budgets.agents` and `.defaultProfile`. Without
    them, an agent's profile is the one its last request used, and `set` is empty (it would
    replace a map whose other entries are unknown).

    An agent with fewer than `min_requests` requests gets no recommendation: it is listed in
    `tooFewRequests` instead.
    """
    by_agent: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_agent[r["agent"]].append(r)
    known = agents is not None and default_profile is not None

    def profile_of(agent: str) -> str | None:
        if agents is not None and default_profile is not None:
            return agents.get(agent, default_profile)
        rows = by_agent.get(agent)
        return rows[-1]["budgetProfile"] if rows else None

    everyone = sorted(set(by_agent) | set(agents or {}))
    out: list[dict[str, Any]] = []
    too_few: list[dict[str, Any]] = []
    for agent, rows in sorted(by_agent.items()):
        n = len(rows)
        profile = rows[-1]["budgetProfile"]
        if n < min_requests:
            too_few.append({"agent": agent, "profile": profile, "requests": n})
            continue
        confidence = round(min(1.0, math.sqrt(n / 50)), 2)  # ~50 requests: full confidence
        shared = [a for a in everyone if a != agent and profile_of(a) == profile]
        unlisted = known and profile == default_profile
        common = {
            "requests": n,
            "confidence": confidence,
            "sharedWith": shared,
            "sharedWithUnlisted": unlisted,
        }
        exceeded = sum(r["exceeded"] for r in rows) / n
        average = sum(r["usagePercent"] for r in rows) / n
        move: tuple[str, str, str] | None = None
        if exceeded > 0.2 and profile in ORDER[:-1]:
            move = (
                "upgrade",
                ORDER[ORDER.index(profile) + 1],
                f"exceeded its budget on {exceeded:.0%} of {n} requests (> 20%)",
            )
        elif average < 40 and profile in ORDER[1:]:
            move = (
                "downgrade",
                ORDER[ORDER.index(profile) - 1],
                f"used {average:.0f}% of its budget on average over {n} requests (< 40%)",
            )
        if move is not None:
            kind, to, reason = move
            values = {"memory.budgets.agents": {**agents, agent: to}} if agents is not None else {}
            out.append(
                {
                    "agent": agent,
                    "kind": kind,
                    "from": profile,
                    "to": to,
                    "reason": reason,
                    "set": values,
                }
                | common
            )
        totals: dict[str, int] = defaultdict(int)
        for r in rows:
            for scope, tokens in r["perScope"].items():
                totals[scope] += tokens
        used = sum(totals.values())
        current = dict(profiles[profile].scope_weights) if profile in profiles else {}
        if used and current:
            actual = {s: round(totals.get(s, 0) / used, 2) for s in current}
            drift = max(abs(actual[s] - current[s]) for s in current)
            if drift > 0.2:
                values = {}
                if agents is not None and default_profile is not None:
                    own = bool(shared) or unlisted
                    values = _weights_change(profiles, agents, agent, profile, actual, own=own)
                out.append(
                    {
                        "agent": agent,
                        "kind": "scope-weights",
                        "profile": profile,
                        "from": current,
                        "to": actual,
                        "reason": f"actual scope use over {n} requests drifts {drift:.0%} "
                        "from the weights",
                        "set": values,
                    }
                    | common
                )
    return {"minRequests": min_requests, "recommendations": out, "tooFewRequests": too_few}


def _weights_change(
    profiles: Mapping[str, BudgetProfile],
    agents: Mapping[str, str],
    agent: str,
    profile: str,
    weights: dict[str, float],
    *,
    own: bool,
) -> dict[str, Any]:
    """The config values that give `agent` these scope weights: its profile changed in place,
    or (`own`, when others use that profile) a copy of it for `agent` alone."""
    table = {
        name: {"tokens": p.tokens, "maxTokens": p.max_tokens, "scopeWeights": dict(p.scope_weights)}
        for name, p in profiles.items()
    }
    name = profile
    if own:
        base = name = f"{agent}-tuned"
        count = 1
        while name in table:
            count += 1
            name = f"{base}-{count}"
    table[name] = {**table[profile], "scopeWeights": weights}
    values: dict[str, Any] = {"memory.budgets.profiles": table}
    if own:
        values["memory.budgets.agents"] = {**agents, agent: name}
    return values


def analysis(
    monitor: Monitor,
    profiles: Mapping[str, BudgetProfile],
    *,
    days: float,
    owner: str | None = None,
    now: float | None = None,
    agents: Mapping[str, str] | None = None,
    default_profile: str | None = None,
    min_requests: int = MIN_REQUESTS,
) -> dict[str, Any]:
    """`ctxbudget analyze`: `analyze` over the usage of the last `days` (every owner, or one),
    with `days` and the number of `requests` read."""
    since = (time.time() if now is None else now) - days * 86_400
    records = monitor.records(since=since, owner=owner)
    found = analyze(
        records,
        profiles,
        agents=agents,
        default_profile=default_profile,
        min_requests=min_requests,
    )
    return {"days": days, "requests": len(records)} | found
