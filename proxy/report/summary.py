"""The report's totals and recent requests, read with plain SQL from either store.

`read_summary` takes a `read(sql, args) -> rows` function, so the server (through its store's
lock) and `ctxbudget report` (its own connection) read the same way.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from ctxbudget.caps import SEGMENT_KINDS
from ctxbudget.proxy.report.record import loads_entry

HOUR = 3600
Read = Callable[[str, Iterable[Any]], list[Any]]
"""`read(sql, args)`: the rows of one query."""


def read_summary(
    read: Read,
    *,
    recent: int,
    owner: str | None = None,
    since: float | None = None,
    sessions_shown: int = 20,
) -> dict[str, Any]:
    """Totals and recent requests of every run that used the file, through
    `read(sql, args) -> rows`: since `since` (counted by the hour: the hour it falls in is
    included whole), or all that is kept; `owner`'s only, or every owner's when None."""
    where, args = "WHERE 1 = 1", []
    if owner is not None:
        where, args = where + " AND owner = ?", [owner]
    hours = " AND hour >= ?" if since is not None else ""
    hour_args = [*args, int(since // HOUR)] if since is not None else args
    totals = _empty_totals()
    counts = read(
        "SELECT sum(requests), sum(clamp_errors), sum(upstream_errors), sum(unpriced), "
        "min(hour), sum(summaries), sum(summaries_failed), sum(summaries_priced), "
        "sum(summaries_input), sum(summaries_output), sum(summaries_usd) "
        f"FROM counts_by_hour {where}{hours}",
        hour_args,
    )
    first_hour = None
    if counts and counts[0][0] is not None:
        (
            totals["requests"],
            totals["clampErrors"],
            totals["upstreamErrors"],
            totals["unpricedRequests"],
            first_hour,
        ) = counts[0][:5]
        totals["summaries"] = _summaries(*counts[0][5:])
    for row in read(
        "SELECT kind, sum(seen), sum(clamped), sum(would_clamp), sum(chars_before), "
        "sum(chars_after), sum(saved_chars), sum(saved_tokens), sum(would_save_chars), "
        "sum(would_save_tokens), sum(saved_usd), sum(would_save_usd) "
        f"FROM totals_by_hour {where}{hours} GROUP BY kind",
        hour_args,
    ):
        kind = dict(zip(_KIND_FIELDS, row[1:], strict=True))
        # `after` as sent (a would-clamp segment went as it was); with every would-clamp
        # applied it would have been `charsAfterWithBudget`
        kind["charsAfterWithBudget"] = kind["charsAfter"]
        kind["charsAfter"] = kind["charsBefore"] - kind["savedChars"]
        totals["byKind"][row[0]] = kind
        for key, value in kind.items():
            totals[key] += value
    recent_since = " AND ts >= ?" if since is not None else ""
    rows = read(
        f"SELECT owner, chunks, body FROM requests {where}{recent_since} ORDER BY ts DESC LIMIT ?",
        [*args, *([since] if since is not None else []), recent],
    )
    entries = [(owner, chunks, loads_entry(body)) for owner, chunks, body in rows]
    with_chunks(read, entries)
    runs = read(
        "SELECT count(*) FROM runs" + (" WHERE started >= ?" if since else ""),
        ([since] if since else []),
    )
    sessions, money = _sessions(read, where, args, since, sessions_shown)
    totals["money"] = money
    return {
        "since": since if since is not None else (first_hour * HOUR if first_hour else None),
        "window": "since" if since is not None else "all",
        "runs": runs[0][0] if runs else 0,
        "totals": totals,
        "recent": [entry for _, _, entry in entries],
        "sessions": sessions,
    }


def with_chunks(read: Read, entries: list[tuple[str, str, dict[str, Any]]]) -> None:
    """Each of `entries` (owner, the chunks its row names, the entry as stored) with its
    segments whole: those kept in chunks its conversation shares (`segment_chunks`, schema
    10: `Tally.chunks`) first, in order, then the ones its row lists."""
    wanted = {chunk for _, chunks, _ in entries for chunk in chunks.split()}
    if not wanted:
        return
    found = {
        (owner, chunk): body
        for owner, chunk, body in read(
            "SELECT owner, id, body FROM segment_chunks"
            f" WHERE id IN ({', '.join('?' * len(wanted))})",
            sorted(wanted),
        )
    }
    for owner, chunks, entry in entries:
        if chunks:
            bodies = [found[(owner, c)] for c in chunks.split() if (owner, c) in found]
            entry["segments"] = loads_entry(f"[{','.join(bodies)}]") + entry["segments"]


_SESSION_COLUMNS = (
    "id, format, model, first, last, last_bust, requests, billed, priced, input, cache_read,"
    " cache_write, output, without_input, without_cache_read, without_cache_write, cost_usd,"
    " without_usd, saved_tokens, memory_tokens, busts_client, busts_ctxbudget, prunes,"
    " busts_planned, tools_inline, tools_inline_tokens, tools_inline_requests"
)


def _sessions(
    read: Read, where: str, args: list[Any], since: float | None, shown: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The newest `shown` sessions active since `since`, and the sums over all of them."""
    active = " AND last >= ?" if since is not None else ""
    active_args = [*args, *([since] if since is not None else [])]
    rows = read(
        f"SELECT {_SESSION_COLUMNS} FROM sessions {where}{active} ORDER BY last DESC LIMIT ?",
        [*active_args, shown],
    )
    sums = read(
        "SELECT count(*), sum(requests), sum(billed), sum(priced), sum(input), sum(cache_read),"
        " sum(cache_write), sum(output), sum(without_input), sum(without_cache_read),"
        " sum(without_cache_write), sum(cost_usd), sum(without_usd), sum(saved_tokens),"
        " sum(memory_tokens), sum(busts_client), sum(busts_ctxbudget), sum(prunes),"
        " sum(busts_planned), sum(CASE WHEN priced = 0 AND billed > 0 THEN 1 ELSE 0 END)"
        f" FROM sessions {where}{active}",
        active_args,
    )
    (count, requests, billed, priced, *rest) = [v or 0 for v in sums[0]] if sums else [0] * 20
    usage = dict(zip(("input", "cacheRead", "cacheWrite", "output"), rest[:4], strict=True))
    without = dict(zip(("input", "cacheRead", "cacheWrite"), rest[4:7], strict=True))
    cost, would, saved_tokens, memory_tokens, client_busts, our_busts = rest[7:13]
    prunes, planned, unpriced = rest[13:]
    money = {
        "sessions": count,
        "requests": requests,
        "billedRequests": billed,
        "pricedRequests": priced,
        "unpricedSessions": unpriced,
        "usage": usage,
        "withoutUsage": without,
        "cacheHitRatio": _hit_ratio(usage),
        "costUsd": cost if priced else None,
        "withoutCtxbudgetUsd": would if priced else None,
        "savedUsd": would - cost if priced else None,
        "savedTokens": saved_tokens,
        "memoryTokens": memory_tokens,
        "cacheBusts": {"client": client_busts, "ctxbudget": our_busts, "planned": planned},
        "prunes": prunes,
    }
    return [_session(row) for row in rows], money


def _session(row: Any) -> dict[str, Any]:
    (sid, wire, model, first, last, last_bust, requests, billed, priced) = row[:9]
    (inp, read, write, out, w_inp, w_read, w_write, cost, would) = row[9:18]
    (saved_tokens, memory_tokens, client_busts, our_busts, prunes, planned) = row[18:24]
    (inline, inline_tokens, inline_requests) = row[24:27]
    usage = {"input": inp, "cacheRead": read, "cacheWrite": write, "output": out}
    return {
        "id": sid,
        "format": wire,
        "model": model,
        "first": first,
        "last": last,
        "requests": requests,
        "billedRequests": billed,
        "usage": usage,
        "withoutUsage": {"input": w_inp, "cacheRead": w_read, "cacheWrite": w_write},
        "cacheHitRatio": _hit_ratio(usage),
        # money only when every billed request of the session had a price
        "costUsd": cost if billed and priced == billed else None,
        "withoutCtxbudgetUsd": would if billed and priced == billed else None,
        "savedUsd": would - cost if billed and priced == billed else None,
        "savedTokens": saved_tokens,
        "memoryTokens": memory_tokens,
        "cacheBusts": {"client": client_busts, "ctxbudget": our_busts, "planned": planned},
        "prunes": prunes,
        "lastCacheBust": last_bust,
        # Claude Code's MCP tools sent inline (tool search off): what it pays for them
        "toolsInline": {"count": inline, "tokens": inline_tokens, "requests": inline_requests}
        if inline
        else None,
    }


def _summaries(
    requests: int, failed: int, priced: int, input: int, output: int, usd: float
) -> dict[str, Any]:
    """What the summaries of pruning (`contextPruning.summarize`) cost the owner: requests
    ctxbudget made itself, so all of it is cost (counted in the sessions' money too).
    `costUsd` is None when a summary's model had no price."""
    return {
        "requests": requests,
        "failed": failed,
        "usage": {"input": input, "output": output},
        "costUsd": usd if priced == requests else None,
    }


def _hit_ratio(usage: dict[str, int]) -> float | None:
    """Cached input read over all input (uncached, read, written); None with no input."""
    total = usage["input"] + usage["cacheRead"] + usage["cacheWrite"]
    return usage["cacheRead"] / total if total else None


_KIND_FIELDS = (
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
)
_UNITS = {"m": 60, "h": HOUR, "d": 86_400, "w": 7 * 86_400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([mhdw])\s*$")


def parse_since(text: str, *, now: float | None = None) -> float:
    """`24h`, `30m`, `7d`, `2w` before now, or an ISO 8601 date or time (UTC when it has no
    zone), as epoch seconds; `ValueError` saying what is accepted.

    >>> parse_since("2h", now=10_000.0)
    2800.0
    >>> parse_since("2026-11-22")
    1795305600.0
    >>> parse_since("99999999999999999999d")
    0.0
    """
    found = _DURATION.match(text)
    if found:
        now = time.time() if now is None else now
        # A duration longer than the calendar is the whole report: the epoch, not a time no
        # database or clock takes (`99999999999999999999d` was a 500, issue 35).
        return max(0.0, now - float(found.group(1)) * _UNITS[found.group(2)])
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"since must be a duration such as 24h, 30m, 7d or 2w, or an ISO 8601 date or "
            f"time such as 2026-11-22 or 2026-11-22T09:00:00Z; got {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _empty_totals() -> dict[str, Any]:
    zero = {
        "seen": 0,
        "clamped": 0,
        "wouldClamp": 0,
        "charsBefore": 0,
        "charsAfter": 0,
        "charsAfterWithBudget": 0,
        "savedChars": 0,
        "savedTokens": 0,
        "wouldSaveChars": 0,
        "wouldSaveTokens": 0,
        "savedUsd": 0.0,
        "wouldSaveUsd": 0.0,
    }
    return {
        "requests": 0,
        "summaries": _summaries(0, 0, 0, 0, 0, 0.0),
        "clampErrors": 0,
        "upstreamErrors": 0,
        "unpricedRequests": 0,
        **zero,
        "byKind": {kind: dict(zero) for kind in SEGMENT_KINDS},
    }
