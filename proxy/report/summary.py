"""The report's totals and recent requests, read with plain SQL from either store.

`read_summary` takes a `read(sql, args) -> rows` function, so the server (through its store's
lock) and `ctxbudget report` (its own connection) read the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import orjson

from caps import SEGMENT_KINDS

Read = Callable[[str, Iterable[Any]], list[Any]]
"""`read(sql, args)`: the rows of one query."""


def read_summary(read: Read, *, recent: int) -> dict[str, Any]:
    """Totals and recent requests of the latest run, through `read(sql, args) -> rows`."""
    runs = read("SELECT run, started FROM runs ORDER BY started DESC, run DESC LIMIT 1", ())
    if not runs:
        return {"run": None, "since": None, "totals": _empty_totals(), "recent": []}
    run, started = runs[0]
    totals = _empty_totals()
    counts = read(
        "SELECT requests, clamp_errors, upstream_errors, unpriced FROM run_counts WHERE run = ?",
        (run,),
    )
    if counts:
        (
            totals["requests"],
            totals["clampErrors"],
            totals["upstreamErrors"],
            totals["unpricedRequests"],
        ) = counts[0]
    for row in read(
        "SELECT kind, seen, clamped, would_clamp, chars_before, chars_after, saved_chars, "
        "saved_tokens, would_save_chars, would_save_tokens, saved_usd, would_save_usd "
        "FROM totals WHERE run = ?",
        (run,),
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
    rows = read("SELECT body FROM requests WHERE run = ? ORDER BY ts DESC LIMIT ?", (run, recent))
    return {
        "run": run,
        "since": started,
        "totals": totals,
        "recent": [orjson.loads(r[0]) for r in rows],
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
