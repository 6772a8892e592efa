"""The report, as JSON and as text: one source (`build_report`), two renderings."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters (ESC, C1, ...) other than tab and newline."""
KIND_TITLES = {
    "bootstrap": "bootstrap files",
    "memory": "memory snippets",
    "web_fetch": "web fetch",
}
_UNITS = {"bootstrap": "per file", "memory": "per memory result", "web_fetch": "per result"}


def build_report(
    summary: dict[str, Any], *, settings: dict[str, Any], request_id: str | None = None
) -> dict[str, Any]:
    """The `/context budget` report: effective settings, totals over the window (everything
    kept, every instance and restart; or since a time), recent requests."""
    return {
        "object": "context_budget.report",
        "generatedAt": _iso(datetime.now(UTC).timestamp()),
        "enabled": settings["enabled"],
        "config": settings["config"],
        "caps": settings["caps"],
        "units": "UTF-16 code units (JavaScript string length, as OpenClaw counts)",
        "encoding": settings["encoding"],
        "since": _iso(summary["since"]) if summary["since"] else None,
        "window": {
            "since": _iso(summary["since"]) if summary["since"] else None,
            "all": summary["window"] == "all",
            "keepDays": settings.get("keepDays"),
            "runs": summary["runs"],
        },
        "totals": summary["totals"],
        "lost": summary.get("lost", 0),
        "recent": [_recent(r) for r in summary["recent"]],
        "sessions": [_session(s) for s in summary["sessions"]],
        **({"requestId": request_id} if request_id else {}),
    }


def _recent(r: dict[str, Any]) -> dict[str, Any]:
    return {**r, "at": _iso(r["at"])}


def _session(s: dict[str, Any]) -> dict[str, Any]:
    return {**s, "first": _iso(s["first"]), "last": _iso(s["last"])}


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _n(value: int) -> str:
    return f"{value:,}"


def money(usd: float | None) -> str:
    """`$0.012345`, or "price unknown" for a model litellm's map does not price."""
    return "price unknown" if usd is None else f"${usd:,.6f}"


WIRE_LABELS = {
    "chat": "chat completions",
    "messages": "Anthropic Messages",
    "responses": "OpenAI Responses",
}


def window_text(report: dict[str, Any]) -> str:
    """`Since 2026-11-22T09:00:00Z (all kept: 90 days, 3 proxy starts)`: what the totals cover."""
    window = report.get("window") or {}
    since = report["since"]
    if since is None:
        return "No requests kept yet"
    if window.get("all", True):
        keep = window.get("keepDays")
        kept = f"{keep:g} days" if isinstance(keep, int | float) else "everything"
        return (
            f"Since {since} (all that is kept: report.keepDays {kept}, "
            f"{_plural(window.get('runs') or 0, 'proxy start')})"
        )
    return f"Since {since} (totals count whole hours)"


def change_text(r: dict[str, Any]) -> str:
    """What an `analyze` recommendation changes, for people."""
    if r["kind"] == "scope-weights":
        return "scope weights " + ", ".join(
            f"{scope} {r['from'][scope]:g} → {r['to'][scope]:g}" for scope in r["from"]
        )
    return f"{r['kind']} to {r['to']}"


def profile_of(r: dict[str, Any]) -> str:
    """The budget profile an `analyze` recommendation would change."""
    return str(r["profile"] if r["kind"] == "scope-weights" else r["from"])


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def wire_label(wire: str | None) -> str:
    """What to call a request's wire format where people read it."""
    return WIRE_LABELS.get(wire or "chat", wire or "chat")


def net_text(money_totals: dict[str, Any]) -> str:
    """`saved $0.123456 net of cache effects over 3 sessions`: the headline, honest sign."""
    count = _plural(money_totals["sessions"], "session")
    saved = money_totals["savedUsd"]
    if saved is None:
        return f"money unknown over {count} (no priced model): tokens only"
    if saved < 0:
        return f"cost {money(-saved)} more net of cache effects over {count}"
    return f"saved {money(saved)} net of cache effects over {count}"


def net_lines(money_totals: dict[str, Any] | None, sessions: list[dict[str, Any]]) -> list[str]:
    """What the provider billed, what it would have without ctxbudget, and the sessions."""
    if not money_totals or not money_totals["sessions"]:
        return []
    usage = money_totals["usage"]
    if not money_totals["billedRequests"]:
        count = _plural(money_totals["sessions"], "session")
        return [f"Billing: no provider usage read yet over {count}"]
    ratio = money_totals["cacheHitRatio"]
    busts = money_totals["cacheBusts"]
    lines = [
        f"Billed: {money(money_totals['costUsd'])} for {_n(usage['input'])} input, "
        f"{_n(usage['cacheRead'])} cache-read, {_n(usage['cacheWrite'])} cache-write and "
        f"{_n(usage['output'])} output tokens; without ctxbudget "
        f"{money(money_totals['withoutCtxbudgetUsd'])} — {net_text(money_totals)}",
        f"Prompt cache: {'n/a' if ratio is None else f'{ratio:.0%}'} of input read from cache; "
        f"cache busts caused by ctxbudget: {busts['ctxbudget']}, by the clients: "
        f"{busts['client']}; memories injected: ~{_n(money_totals['memoryTokens'])} tokens "
        "(a cost, counted above)",
    ]
    if sessions:
        lines.append("Sessions (newest first):")
    for s in sessions[:5]:
        hit = s["cacheHitRatio"]
        lines.append(
            f"- {s['id']} ({wire_label(s['format'])}, {s['model'] or '?'}): "
            f"{_plural(s['requests'], 'request')}, {money(s['costUsd'])} "
            f"vs {money(s['withoutCtxbudgetUsd'])} without ctxbudget; "
            f"cache hits {'n/a' if hit is None else f'{hit:.0%}'}, busts by ctxbudget "
            f"{s['cacheBusts']['ctxbudget']}"
            + (f" (last: {s['lastCacheBust']})" if s.get("lastCacheBust") else "")
        )
    return lines


def render_text(report: dict[str, Any]) -> str:
    """The report as text, for people: `ctxbudget report`, `?format=text`, the chat command."""
    lines: list[str] = []
    on = report["enabled"]
    lines.append(
        f"📉 Context budget: {'ON' if on else 'OFF'} (agents.defaults.contextBudget.enabled)"
    )
    config = report["config"]
    where = config["path"] or "built-in defaults"
    lines.append(f"Config: {where} (loaded {config['loadedAt']})")
    if config.get("error"):
        lines.append(f"⚠ Config error, last good config still in force: {config['error']}")
    lines.append("Effective caps (UTF-16 chars):")
    for kind, cap in report["caps"].items():
        value = "no limit" if cap["value"] is None else f"{_n(cap['value'])} {_UNITS[kind]}"
        lines.append(f"- {KIND_TITLES[kind]}: {value} — from {cap['source']} ({cap['from']})")
    totals = report["totals"]
    lines.append("")
    lines.append(
        f"{window_text(report)}: {_plural(totals['requests'], 'request')}, "
        f"{_n(totals['seen'])} segments seen, "
        f"{_n(totals['clamped'])} clamped"
        + (f", {_n(totals['wouldClamp'])} would clamp" if totals["wouldClamp"] else "")
    )
    lines.append(
        f"Saved: {_n(totals['savedChars'])} chars (~{_n(totals['savedTokens'])} tokens, "
        f"{report['encoding']} for unknown models) = {money(totals['savedUsd'])} at input prices"
    )
    if totals["wouldSaveChars"]:
        lines.append(
            f"Would save with the budget on: {_n(totals['wouldSaveChars'])} chars "
            f"(~{_n(totals['wouldSaveTokens'])} tokens) = {money(totals['wouldSaveUsd'])}"
        )
    lines.extend(net_lines(totals.get("money"), report.get("sessions") or []))
    if totals["unpricedRequests"]:
        lines.append(
            f"{_n(totals['unpricedRequests'])} request(s) for models without a price in "
            "litellm's map: their savings count in tokens only"
        )
    if totals["clampErrors"]:
        lines.append(
            f"⚠ {totals['clampErrors']} request(s) forwarded untouched after a clamp error"
        )
    if report.get("lost"):
        lines.append(
            f"⚠ {_plural(report['lost'], 'request')} answered by this proxy could not be "
            "recorded (the report database did not answer; see the log)"
        )
    lines.append("By kind:")
    for kind, t in totals["byKind"].items():
        lines.append(
            f"- {KIND_TITLES[kind]}: {_n(t['seen'])} seen, {_n(t['clamped'])} clamped"
            + (f", {_n(t['wouldClamp'])} would clamp" if t["wouldClamp"] else "")
            + f"; {_n(t['charsBefore'])} → {_n(t['charsAfter'])} chars sent; "
            f"saved {_n(t['savedChars'])} chars (~{_n(t['savedTokens'])} tokens, "
            f"{money(t['savedUsd'])})"
            + (
                f"; would save {_n(t['wouldSaveChars'])} more with the budget on"
                if t["wouldSaveChars"]
                else ""
            )
        )
    analysis = report.get("analysis") or {}
    for r in analysis.get("recommendations", []):
        lines.append(
            f"Recommendation for {r['agent']} ({profile_of(r)}): {change_text(r)} — {r['reason']} "
            f"(confidence {r['confidence']:.2f}; `ctxbudget analyze` prints the config to paste)"
        )
    if report.get("page"):
        lines.append(f"Report page with plots: {report['page']} (open it in a browser)")
    if report["recent"]:
        lines.append("")
        lines.append("Recent requests:")
    for r in report["recent"]:
        flags = "on" if r["enabled"] else "off"
        lines.append(
            f"- {r['id']} {r['at']} {r.get('model') or '?'} ({wire_label(r.get('wire'))}) "
            f"[{flags}] HTTP {r['status']}: "
            f"{r['clamped']} clamped, saved {_n(r['savedChars'])} chars "
            f"(~{_n(r['savedTokens'])} tokens, {money(r['savedUsd'])})"
            + (f", would save {_n(r['wouldSaveChars'])} chars" if r["wouldSaveChars"] else "")
        )
        if r.get("note"):
            lines.append(f"  note: {r['note']}")
        memory = r.get("memory")
        if memory:
            lines.append(
                f"  memories: {memory['applied']} ({memory['reason']}), "
                f"{_plural(memory['candidates'], 'candidate')}, {memory['injected']} injected "
                f"({_n(memory['chars'])} of {_n(memory['maxChars'])} chars), "
                f"bound by {memory['boundBy']}"
            )
        elif r.get("memoriesReused"):
            lines.append(
                f"  memories: {r['memoriesReused']} placed again where this session had them "
                "(recall runs once per user turn; the cached prefix holds)"
            )
        elif r.get("memorySkipped"):
            lines.append(f"  memories: none, {r['memorySkipped']}")
        if r.get("clampError"):
            lines.append(f"  ⚠ clamp error, forwarded untouched: {r['clampError']}")
        if r.get("cacheBust"):
            lines.append(f"  ⚠ cache bust caused by ctxbudget: {r['cacheBust']}")
        for s in r["segments"]:
            label = s["label"]
            note = f" ({s['note']})" if s.get("note") else ""
            lines.append(
                f"  - {s['kind']} {label}: {_n(s['before'])} → {_n(s['after'])} {s['action']}{note}"
            )
    # Paths, URLs and tool names come from clients: a terminal must not run their escapes.
    return _CONTROL.sub("", "\n".join(lines)) + "\n"
