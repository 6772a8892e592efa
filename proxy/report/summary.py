"""The report's totals and recent requests, read with plain SQL from either store.

`read_summary` takes a `read(sql, args) -> rows` function, so the server (through its store's
lock) and `ctxbudget report` (its own connection) read the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from caps import SEGMENT_KINDS
from proxy.report.record import loads_entry

Read = Callable[[str, Iterable[Any]], list[Any]]
"""`read(sql, args)`: the rows of one query."""


def read_summary(read: Read, *, recent: int, owner: str | None = None) -> dict[str, Any]:
    """Totals and recent requests of the latest run, through `read(sql, args) -> rows`:
    `owner`'s only, or every owner's when None."""
    mine, args = ("", ()) if owner is None else (" AND owner = ?", (owner,))
    runs = read("SELECT run, started FROM runs ORDER BY started DESC, run DESC LIMIT 1", ())
    if not runs:
        return {"run": None, "since": None, "totals": _empty_totals(), "recent": []}
    run, started = runs[0]
    totals = _empty_totals()
    counts = read(
        "SELECT sum(requests), sum(clamp_errors), sum(upstream_errors), sum(unpriced) "
        "FROM run_counts WHERE run = ?" + mine,
        (run, *args),
    )
    if counts and counts[0][0] is not None:
        (
            totals["requests"],
            totals["clampErrors"],
            totals["upstreamErrors"],
            totals["unpricedRequests"],
        ) = counts[0]
    for row in read(
        "SELECT kind, sum(seen), sum(clamped), sum(would_clamp), sum(chars_before), "
        "sum(chars_after), sum(saved_chars), sum(saved_tokens), sum(would_save_chars), "
        "sum(would_save_tokens), sum(saved_usd), sum(would_save_usd) "
        "FROM totals WHERE run = ?" + mine + " GROUP BY kind",
        (run, *args),
    ):
        kind = dict(
            zip(
                (
                    "seen",
                    "clamped",
                    "wouldClamp",
                    "charsBefore",
                    "charsAfter",
                    "savedChars",
                    "savedTokens",
                    "wouldSaveChars",
                    "wouldSaveTokens",
                    "savedUsd",
                    "wouldSaveUsd",
                ),
                row[1:],
                strict=True,
            )
        )
        totals["byKind"][row[0]] = kind
        for key, value in kind.items():
            totals[key] += value
    rows = read(
        "SELECT body FROM requests WHERE run = ?" + mine + " ORDER BY ts DESC LIMIT ?",
        (run, *args, recent),
    )
    return {
        "run": run,
        "since": started,
        "totals": totals,
        "recent": [loads_entry(r[0]) for r in rows],
    }


def _empty_totals() -> dict[str, Any]:
    zero = {
        "seen": 0,
        "clamped": 0,
        "wouldClamp": 0,
        "charsBefore": 0,
        "charsAfter": 0,
        "savedChars": 0,
        "savedTokens": 0,
        "wouldSaveChars": 0,
        "wouldSaveTokens": 0,
        "savedUsd": 0.0,
        "wouldSaveUsd": 0.0,
    }
    return {
        "requests": 0,
        "clampErrors": 0,
        "upstreamErrors": 0,
        "unpricedRequests": 0,
        **zero,
        "byKind": {kind: dict(zero) for kind in SEGMENT_KINDS},
    }
