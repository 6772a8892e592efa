"""The holdout's comparison: what a request costs in each arm, on the provider's own bill.

The report reads one row per conversation (`proxy/report/arms.py`) and compares the arms
(`docs/holdout.md` says why this is sound and how long to run it):

- the cost per request of an arm is a ratio, `R = Σ cost / Σ requests`, over its
  conversations (requests with a price only);
- its variance is clustered by conversation (a conversation's requests share its length,
  model and cache: they are not independent): the delete-one-conversation jackknife of
  `log R` (on 200 simulated populations it held the truth 92% of the time at a 20% share,
  where the linearised ratio variance held it 90%: costs per conversation are very skewed);
- the saving is `1 − R_budget / R_holdout`, its 95% interval from the log of the ratio
  (`se² = V_b + V_h`, the arms independent) with Student's t on the smaller arm's
  conversations less one, so few conversations widen it rather than overstate it.

The per-request counterfactual (`withoutCtxbudgetUsd`) is not used as a covariate: in the
budget arm it is the estimate under test, so borrowing its precision would borrow its bias;
it is shown beside the measurement instead (`estimatedPct`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from ctxbudget.proxy.report.arms import ARMS

MIN_CONVERSATIONS = 20
"""Below this many priced conversations in either arm the saving is "not enough data yet":
with fewer, a cluster-robust interval misses the true saving far more often than 5% (the
coverage test, `tests/proxy/report/test_holdout.py`, 90%+ from 20 a side)."""
ENDED_SECONDS = 1800.0
"""A conversation idle this long has ended (for `endedAfterPrune`)."""
ENDED_TURNS = 2
"""An ended conversation whose last clamp or prune came within this many of its last turns
counts in `endedAfterPrune`."""
METHOD = (
    "cost per request, ratio of sums per arm; 95% interval clustered by conversation "
    "(jackknife over conversations, log scale, Student's t)"
)


def t95(df: int) -> float:
    """Student's t two-sided 95% quantile (Cornish-Fisher expansion; exact to ~0.01 from df 3).

    >>> round(t95(10), 2), round(t95(1000), 2)
    (2.23, 1.96)
    """
    z = 1.959964
    df = max(df, 1)
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def log_ratio(costs: Sequence[float], counts: Sequence[int]) -> tuple[float, float] | None:
    """The log of an arm's cost per request over its clusters (`costs[c]`, `counts[c]`), and
    that log's variance by the delete-one-conversation jackknife; None with fewer than two
    clusters, or a cost per request of 0 (with one conversation left out too).

    >>> found = log_ratio([1.0, 2.0, 3.0], [1, 2, 3])
    >>> round(math.exp(found[0]), 6), found[1]
    (1.0, 0.0)
    """
    n = len(costs)
    total, requests = sum(costs), sum(counts)
    if n < 2 or total <= 0 or requests <= 0:
        return None
    left: list[float] = []
    for y, m in zip(costs, counts, strict=True):
        if total - y <= 0 or requests - m <= 0:
            return None
        left.append(math.log((total - y) / (requests - m)))
    mean = sum(left) / n
    return math.log(total / requests), (n - 1) / n * sum((x - mean) ** 2 for x in left)


def saving(
    budget: tuple[Sequence[float], Sequence[int]],
    holdout: tuple[Sequence[float], Sequence[int]],
) -> dict[str, Any]:
    """The measured saving per request, in percent, and its 95% interval: `pct`, `low`,
    `high` (None when either arm has fewer than two priced conversations), and `enough`."""
    b, h = log_ratio(*budget), log_ratio(*holdout)
    n = min(len(budget[0]), len(holdout[0]))
    found: dict[str, Any] = {"pct": None, "low": None, "high": None}
    if b is not None and h is not None:
        log = b[0] - h[0]
        se = math.sqrt(b[1] + h[1])  # the arms are drawn apart: independent
        t = t95(n - 1)
        found = {
            "pct": round(100 * (1 - math.exp(log)), 1),
            "low": round(100 * (1 - math.exp(log + t * se)), 1),
            "high": round(100 * (1 - math.exp(log - t * se)), 1),
        }
    return {**found, "enough": n >= MIN_CONVERSATIONS and found["pct"] is not None}


def comparison(
    rows: Sequence[dict[str, Any]], *, share: float, now: float
) -> dict[str, Any] | None:
    """The report's `holdout` object from the conversations' rows (`arms.conversations`);
    None when there is no holdout and never was (no share, no rows)."""
    compared = [r for r in rows if not r["chosen"]]
    if share <= 0 and not compared:
        return None
    by_arm = {arm: [r for r in compared if r["arm"] == arm] for arm in ARMS}
    priced = {arm: [r for r in found if r["priced"] > 0] for arm, found in by_arm.items()}
    measured = saving(
        *(
            ([r["cost_usd"] for r in priced[arm]], [r["priced"] for r in priced[arm]])
            for arm in ARMS
        )
    )
    without = sum(r["without_usd"] for r in priced["budget"])
    estimated = (
        round(100 * (without - sum(r["cost_usd"] for r in priced["budget"])) / without, 1)
        if without > 0
        else None
    )
    return {
        "share": share,
        "since": _iso(min(r["drawn"] for r in compared)) if compared else None,
        "arms": {arm: _arm(found, now) for arm, found in by_arm.items()},
        "excluded": len(rows) - len(compared),
        "saving": {**measured, "estimatedPct": estimated, "method": METHOD},
        "series": _series(compared),
    }


def _arm(rows: Sequence[dict[str, Any]], now: float) -> dict[str, Any]:
    n = len(rows)
    turns = sum(r["turns"] for r in rows)
    priced = sum(r["priced"] for r in rows)
    cost = sum(r["cost_usd"] for r in rows)
    return {
        "conversations": n,
        "requests": sum(r["requests"] for r in rows),
        "usage": {
            "input": sum(r["input"] for r in rows),
            "cacheRead": sum(r["cache_read"] for r in rows),
            "cacheWrite": sum(r["cache_write"] for r in rows),
            "output": sum(r["output"] for r in rows),
        },
        "costUsd": round(cost, 6),
        "costPerRequestUsd": round(cost / priced, 8) if priced else None,
        "turnsPerConversation": round(turns / n, 2) if n else None,
        "toolCallsPerTurn": round(sum(r["tool_calls"] for r in rows) / turns, 2) if turns else None,
        "rerunsAfterPrune": round(sum(r["reruns"] for r in rows) / n, 2) if n else None,
        "upstreamErrors": sum(r["upstream_errors"] for r in rows),
        "endedAfterPrune": sum(
            r["acted_turn"] >= 0
            and now - r["last"] >= ENDED_SECONDS
            and r["turns"] - r["acted_turn"] <= ENDED_TURNS
            for r in rows
        ),
    }


def _series(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each arm's cost per request by the day its conversations began (by the hour when they
    all began within two days), for the page's chart."""
    if not rows:
        return []
    first = min(r["drawn"] for r in rows)
    span = max(r["drawn"] for r in rows) - first
    step = 3600.0 if span < 2 * 86_400 else 86_400.0
    buckets: dict[int, dict[str, list[float]]] = {}
    for r in rows:
        sums = buckets.setdefault(int(r["drawn"] // step), {a: [0.0, 0.0] for a in ARMS})
        sums[r["arm"]][0] += r["cost_usd"]
        sums[r["arm"]][1] += r["priced"]
    return [
        {
            "at": _iso(key * step),
            **{arm: round(s[0] / s[1], 8) if s[1] else None for arm, s in sorted(sums.items())},
        }
        for key, sums in sorted(buckets.items())
    ]


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
