"""The report, as JSON and as text: one source (`build_report`), two renderings."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from ctxbudget.proxy.report.holdout import MIN_CONVERSATIONS

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters (ESC, C1, ...) other than tab and newline."""
KIND_TITLES = {
    "bootstrap": "bootstrap files",
    "memory": "memory snippets",
    "web_fetch": "web fetch",
    "tool_output": "tool output",
    "pruned": "pruned tool results",
}
_UNITS = {
    "bootstrap": "per file",
    "memory": "per memory result",
    "web_fetch": "per result",
    "tool_output": "per result",
    "pruned": "per result",
}


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


MINUS = "\u2212"
"""A negative amount's sign where people read it: `−$0.000060`, not `$-0.000060`."""


def money(usd: float | None) -> str:
    """`$0.012345`, `−$0.000060` for a loss, or "price unknown" for a model litellm's map
    does not price.

    >>> money(0.0123454), money(-0.00006), money(-1e-12), money(None)
    ('$0.012345', '−$0.000060', '$0.000000', 'price unknown')
    """
    if usd is None:
        return "price unknown"
    shown = f"${abs(usd):,.6f}"
    return MINUS + shown if usd < 0 and shown != "$0.000000" else shown


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


def no_recommendations(analysis: dict[str, Any]) -> str:
    """What to say when `analyze` recommends nothing: that it has too little to go on, or
    that the budgets fit (as `ctxbudget analyze` says it)."""
    if analysis.get("tooFewRequests") or not analysis.get("requests"):
        needs = analysis.get("minRequests")
        return "None yet: not enough data" + (
            f" (a recommendation needs {needs} requests with memory recall of one agent)"
            if needs
            else ""
        )
    return "None: budgets fit the observed use."


def profile_of(r: dict[str, Any]) -> str:
    """The budget profile an `analyze` recommendation would change."""
    return str(r["profile"] if r["kind"] == "scope-weights" else r["from"])


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def wire_label(wire: str | None) -> str:
    """What to call a request's wire format where people read it."""
    return WIRE_LABELS.get(wire or "chat", wire or "chat")


def net_text(money_totals: dict[str, Any] | None, requests: int) -> str:
    """`saved $0.123456 net of cache effects over 3 sessions`: the headline, honest sign
    (`saved −$0.000060 …: ctxbudget cost more than it saved` for a loss); `requests`: all
    the report counts."""
    if not requests:
        return "saved nothing yet: no requests kept"
    if not money_totals or not money_totals["billedRequests"]:
        return f"net saving unknown over {_plural(requests, 'request')}: no provider usage read yet"
    count = _plural(money_totals["sessions"], "session")
    saved = money_totals["savedUsd"]
    if saved is None:
        return f"net saving unknown over {count} (no priced model): tokens only"
    if money(saved).startswith(MINUS):
        return (
            f"saved {money(saved)} net of cache effects over {count}: ctxbudget cost more "
            "than it saved (memories injected, cache busts)"
        )
    return f"saved {money(saved)} net of cache effects over {count}"


def headline(report: dict[str, Any]) -> str:
    """The report's first line: the money saved net of cache effects, what the provider
    billed and what it would have billed without ctxbudget."""
    money_totals = report["totals"].get("money")
    line = f"📉 ctxbudget {net_text(money_totals, report['totals']['requests'])}"
    if money_totals and money_totals.get("savedUsd") is not None:
        line += (
            f" (billed {money(money_totals['costUsd'])}; "
            f"{money(money_totals['withoutCtxbudgetUsd'])} without ctxbudget)"
        )
    return line


def measured_text(report: dict[str, Any]) -> str | None:
    """The holdout's line, after the money line: the saving measured on the user's own bill
    (`docs/holdout.md`), or why there is none yet; None without a holdout."""
    found = report.get("holdout")
    if not found:
        return None
    budget, holdout = found["arms"]["budget"], found["arms"]["holdout"]
    counts = f"{_n(budget['conversations'])} vs {_n(holdout['conversations'])} conversations"
    saved = found["saving"]
    if not saved["enough"]:
        return (
            f"Measured on your traffic: not enough data yet ({counts}; "
            f"{MIN_CONVERSATIONS} a side needed, holdout {found['share']:g})"
        )
    pct, low, high = saved["pct"], saved["low"], saved["high"]
    how = f"{pct:g}% less" if pct >= 0 else f"{-pct:g}% more"
    line = f"Measured on your traffic: {how} per request (95%: {low:g}–{high:g}%), {counts}"
    if saved["estimatedPct"] is not None:
        line += f"; estimated {saved['estimatedPct']:g}%"
    reruns = (budget["rerunsAfterPrune"], holdout["rerunsAfterPrune"])
    if None not in reruns:
        line += f"; reruns after a prune {reruns[0]:g} vs {reruns[1]:g} per conversation"
    return line


def _head(report: dict[str, Any]) -> list[str]:
    """The money line, and the holdout's after it when there is one."""
    measured = measured_text(report)
    return [headline(report)] if measured is None else [headline(report), measured]


def gross_text(totals: dict[str, Any], encoding: str) -> str:
    """What the clamps removed, before cache effects: chars, tokens and their input price."""
    return (
        f"Gross, before cache effects: {_n(totals['savedChars'])} chars removed "
        f"(~{_n(totals['savedTokens'])} tokens, {encoding} for unknown models) = "
        f"{money(totals['savedUsd'])} at the full input price"
    )


NET_ABOVE_GROSS = (
    "Net above gross: gross counts the removed text's own tokens at the input price; net is "
    "the provider's bill, which counts the request as it is sent (JSON: a tool result's quotes "
    "and newlines are escapes, and tokens too) and prices cache writes above the input price"
)
"""Said where net and gross are both shown, when the net saving (of the totals or of a listed
request) is the larger: not an error in either figure, but two different counts."""


def net_above_gross(report: dict[str, Any]) -> bool:
    """Whether a net saving shown is above its gross figure (the totals', or a listed
    request's): then `NET_ABOVE_GROSS` goes with them."""
    totals = report["totals"]
    net = (totals.get("money") or {}).get("savedUsd")
    pairs = [(net, totals.get("savedUsd"))]
    pairs += [(r.get("netSavedUsd"), r.get("savedUsd")) for r in report.get("recent") or []]
    # a cent's ten-thousandth either way is rounding, not a difference worth a line
    return any(n is not None and g is not None and n > g + 1e-6 for n, g in pairs)


def net_lines(
    money_totals: dict[str, Any] | None,
    sessions: list[dict[str, Any]],
    summaries: dict[str, Any] | None = None,
) -> list[str]:
    """What the provider billed, what it would have without ctxbudget, what pruning's
    summaries cost, and the sessions."""
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
        f"{money(money_totals['withoutCtxbudgetUsd'])}",
        f"Prompt cache: {'n/a' if ratio is None else f'{ratio:.0%}'} of input read from cache; "
        f"cache busts caused by ctxbudget: {busts['ctxbudget']}, by the clients: "
        f"{busts['client']}; memories injected: ~{_n(money_totals['memoryTokens'])} tokens "
        "(a cost, counted above)",
    ]
    if money_totals.get("prunes"):
        lines.append(
            f"Pruning: {_plural(money_totals['prunes'], 'stale tool result')} pruned; "
            f"{_plural(busts.get('planned', 0), 'planned cache bust')} (a prune in a warm "
            "session, taken because the reads it saves outweigh the rewrite; priced above)"
        )
    if summaries and summaries["requests"]:
        failed = f", {summaries['failed']:,} failed" if summaries["failed"] else ""
        lines.append(
            f"Summaries (contextPruning.summarize): {_plural(summaries['requests'], 'request')}"
            f"{failed}, {_n(summaries['usage']['input'])} input and "
            f"{_n(summaries['usage']['output'])} output tokens, {money(summaries['costUsd'])} "
            "(a cost ctxbudget adds, counted above)"
        )
    if sessions:
        lines.append("Sessions (newest first):")
    for s in sessions[:5]:
        hit = s["cacheHitRatio"]
        lines.append(
            f"- {s['id']} ({wire_label(s['format'])}, {s['model'] or '?'}): "
            f"{_plural(s['requests'], 'request')}, saved {money(s['savedUsd'])} net "
            f"({money(s['costUsd'])} vs {money(s['withoutCtxbudgetUsd'])} without ctxbudget); "
            f"cache hits {'n/a' if hit is None else f'{hit:.0%}'}, busts by ctxbudget "
            f"{s['cacheBusts']['ctxbudget']}"
            + (f" (last: {s['lastCacheBust']})" if s.get("lastCacheBust") else "")
            + (
                f"; {_plural(s['prunes'], 'result')} pruned, "
                f"{s['cacheBusts'].get('planned', 0)} planned"
                if s.get("prunes")
                else ""
            )
        )
    return lines


TOOL_SEARCH_FIX = (
    "start Claude Code with ENABLE_TOOL_SEARCH=true (and without "
    "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS) and begin a new conversation: its MCP tools are then "
    "deferred and found by tool search, which ctxbudget passes through untouched"
)
"""What to set when a session sends MCP tool definitions inline (docs/openclaw.md)."""


def tools_inline_text(sessions: list[dict[str, Any]]) -> str | None:
    """The advice for sessions that sent Claude Code's MCP tools inline (`toolsInline`), or
    None when no shown session did.

    >>> s = {"id": "a1", "toolsInline": {"count": 60, "tokens": 11234, "requests": 3}}
    >>> print(tools_inline_text([s, {"id": "b2", "toolsInline": None}])[:89])
    ⚠ Tool search off: session a1 sent 60 MCP tool definitions inline (~11,234 tokens on each
    """
    flagged = [s for s in sessions if s.get("toolsInline")]
    if not flagged:
        return None
    s = flagged[0]
    t = s["toolsInline"]
    more = f" (and {_plural(len(flagged) - 1, 'other session')})" if len(flagged) > 1 else ""
    return (
        f"⚠ Tool search off: session {s['id']}{more} sent {_n(t['count'])} MCP tool definitions "
        f"inline (~{_n(t['tokens'])} tokens on each of {_plural(t['requests'], 'request')}, "
        f"~{_n(t['tokens'] * t['requests'])} in all): {TOOL_SEARCH_FIX}"
    )


TEXT_SECTIONS = {
    "caps": "the effective caps and where each came from",
    "money": "what the provider billed, with and without ctxbudget, per session",
    "kinds": "chars and tokens removed per kind (gross)",
    "requests": "the latest requests, each with its clamps",
    "memory": "memory recall per request, and the budget recommendations",
}
"""Sections of the text report a user can ask for one at a time (`/context budget full caps`,
`GET /context/budget?format=text&section=caps`), with what each holds; plain `full` is all
of them."""


SUMMARY_CLAMPS = 5
"""Segments the summary lists (the most chars removed first)."""
_LABEL = 72
"""Longest label (path, URL, tool) the summary shows whole."""


def render_summary(report: dict[str, Any]) -> str:
    """The chat-sized report (`/context budget`): on/off, caps, net money, the biggest clamps,
    where to see more — at most ~25 lines, whatever the traffic (`full` is `render_text`)."""
    totals = report["totals"]
    config = report["config"]
    lines = [
        *_head(report),
        f"Context budget: {'ON' if report['enabled'] else 'OFF'} "
        f"(agents.defaults.contextBudget.enabled) · config "
        f"{config['path'] or 'built-in defaults'}",
    ]
    if config.get("error"):
        lines.append(f"⚠ Config error, last good config in force: {_short(config['error'], 200)}")
    lines.append(
        "Caps: "
        + " · ".join(
            f"{KIND_TITLES[kind]} "
            + ("no limit" if cap["value"] is None else f"{_n(cap['value'])} {_UNITS[kind]}")
            for kind, cap in report["caps"].items()
        )
    )
    money_totals = totals.get("money") or {}
    busts = (money_totals.get("cacheBusts") or {}).get("ctxbudget", 0)
    lines.append(
        f"{window_text(report)}: {_plural(totals['requests'], 'request')}, "
        f"{_n(totals['clamped'])} segments clamped"
        + (f", {_n(totals['wouldClamp'])} would clamp" if totals["wouldClamp"] else "")
        + f"; cache busts caused by ctxbudget: {busts}"
    )
    lines.append(gross_text(totals, report["encoding"]))
    if net_above_gross(report):
        lines.append(NET_ABOVE_GROSS)
    if totals["clampErrors"]:
        lines.append(f"⚠ {totals['clampErrors']} request(s) forwarded untouched (clamp error)")
    advice = tools_inline_text(report.get("sessions") or [])
    if advice:
        lines.append(advice)
    top = _top_clamps(report["recent"])
    if top:
        lines.append(f"Biggest clamps in the latest {_plural(len(report['recent']), 'request')}:")
    for (kind, label, action), (count, before, after) in top:
        times = f" ({count}×)" if count > 1 else ""
        would = " (would clamp)" if action == "would-clamp" else ""
        lines.append(
            f"- {kind} {_short(label, _LABEL)}: {_n(before)} → {_n(after)} chars{would}{times}"
        )
    recommendations = (report.get("analysis") or {}).get("recommendations", [])
    if recommendations:
        r = recommendations[0]
        more = f" (+{len(recommendations) - 1} more)" if len(recommendations) > 1 else ""
        lines.append(
            f"Recommendation for {r['agent']}: {change_text(r)}{more} — `ctxbudget analyze`"
        )
    page = f" · the page: {report['page']}" if report.get("page") else ""
    sections = ", ".join(TEXT_SECTIONS)
    lines.append(
        f"More: /context budget full (every request; one part: full {sections}) · "
        f"/context budget json{page}"
    )
    return _CONTROL.sub("", "\n".join(lines)) + "\n"


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _top_clamps(
    recent: list[dict[str, Any]],
) -> list[tuple[tuple[str, str, str], tuple[int, int, int]]]:
    """The segments that lost the most chars in `recent`, one line per kind and label: how
    often, and before → after the last time."""
    found: dict[tuple[str, str, str], list[int]] = {}
    for r in reversed(recent):  # oldest first: the last time seen wins
        for seg in r["segments"]:
            if seg["action"] not in ("clamped", "would-clamp"):
                continue
            key = (seg["kind"], str(seg["label"]), seg["action"])
            count, removed = found.get(key, [0, 0, 0, 0])[:2]
            found[key] = [count + 1, removed + seg["saved"], seg["before"], seg["after"]]
    ranked = sorted(found.items(), key=lambda item: -item[1][1])[:SUMMARY_CLAMPS]
    return [(key, (v[0], v[2], v[3])) for key, v in ranked]


def render_text(report: dict[str, Any], section: str | None = None) -> str:
    """The report as text, for people: `ctxbudget report`, `?format=text`, the chat command.

    With `section` (a key of `TEXT_SECTIONS`), only the headline and that section: the whole
    text runs to hundreds of lines, too long for a chat.
    """
    if section is not None:
        parts = {
            "caps": _caps_lines,
            "money": _money_lines,
            "kinds": _kind_lines,
            "requests": _request_lines,
            "memory": _memory_lines,
        }
        others = ", ".join(name for name in TEXT_SECTIONS if name != section)
        part = [*_head(report), *parts[section](report)]
        part.append(f"Other sections: {others} (/context budget full <section>)")
        return _CONTROL.sub("", "\n".join(part)) + "\n"
    lines: list[str] = [*_head(report), *_caps_lines(report), ""]
    lines.extend(_money_lines(report))
    lines.extend(_kind_lines(report))
    lines.extend(_recommendation_lines(report))
    if report.get("page"):
        lines.append(f"Report page with plots: {report['page']} (open it in a browser)")
    if report["recent"]:
        lines.append("")
    lines.extend(_request_lines(report))
    # Paths, URLs and tool names come from clients: a terminal must not run their escapes.
    return _CONTROL.sub("", "\n".join(lines)) + "\n"


def _caps_lines(report: dict[str, Any]) -> list[str]:
    on = report["enabled"]
    lines = [f"Context budget: {'ON' if on else 'OFF'} (agents.defaults.contextBudget.enabled)"]
    config = report["config"]
    where = config["path"] or "built-in defaults"
    lines.append(f"Config: {where} (loaded {config['loadedAt']})")
    if report.get("data"):  # `ctxbudget report`: the files it read
        lines.append(
            f"Data: report {report['data']['report']}, memories {report['data']['memories']}"
        )
    if config.get("error"):
        lines.append(f"⚠ Config error, last good config still in force: {config['error']}")
    lines.append("Effective caps (UTF-16 chars):")
    for kind, cap in report["caps"].items():
        value = "no limit" if cap["value"] is None else f"{_n(cap['value'])} {_UNITS[kind]}"
        lines.append(f"- {KIND_TITLES[kind]}: {value} — from {cap['source']} ({cap['from']})")
    return lines


def _money_lines(report: dict[str, Any]) -> list[str]:
    totals = report["totals"]
    lines = [
        f"{window_text(report)}: {_plural(totals['requests'], 'request')}, "
        f"{_n(totals['seen'])} segments seen, "
        f"{_n(totals['clamped'])} clamped"
        + (f", {_n(totals['wouldClamp'])} would clamp" if totals["wouldClamp"] else "")
    ]
    lines.extend(
        net_lines(totals.get("money"), report.get("sessions") or [], totals.get("summaries"))
    )
    advice = tools_inline_text(report.get("sessions") or [])
    if advice:
        lines.append(advice)
    return lines


def _kind_lines(report: dict[str, Any]) -> list[str]:
    totals = report["totals"]
    lines = [gross_text(totals, report["encoding"])]
    if net_above_gross(report):
        lines.append(NET_ABOVE_GROSS)
    if totals["wouldSaveChars"]:
        lines.append(
            f"Would remove with the budget on: {_n(totals['wouldSaveChars'])} chars "
            f"(~{_n(totals['wouldSaveTokens'])} tokens) = {money(totals['wouldSaveUsd'])} "
            "gross"
        )
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
            f"removed {_n(t['savedChars'])} chars (~{_n(t['savedTokens'])} tokens, "
            f"{money(t['savedUsd'])} gross)"
            + (
                f"; would save {_n(t['wouldSaveChars'])} more with the budget on"
                if t["wouldSaveChars"]
                else ""
            )
        )
    return lines


def _recommendation_lines(report: dict[str, Any]) -> list[str]:
    analysis = report.get("analysis") or {}
    return [
        f"Recommendation for {r['agent']} ({profile_of(r)}): {change_text(r)} — {r['reason']} "
        f"(confidence {r['confidence']:.2f}; `ctxbudget analyze` prints the config to paste)"
        for r in analysis.get("recommendations", [])
    ]


def _memory_line(r: dict[str, Any]) -> str | None:
    """What recall did for request `r`, or None when it did nothing."""
    memory = r.get("memory")
    if memory:
        return (
            f"memories: {memory['applied']} ({memory['reason']}), "
            f"{_plural(memory['candidates'], 'candidate')}, {memory['injected']} injected "
            f"({_n(memory['chars'])} of {_n(memory['maxChars'])} chars), "
            f"bound by {memory['boundBy']}"
        )
    if r.get("memoriesReused"):
        return (
            f"memories: {r['memoriesReused']} placed again where this session had them "
            "(recall runs once per user turn; the cached prefix holds)"
        )
    if r.get("memorySkipped"):
        return f"memories: none, {r['memorySkipped']}"
    return None


def _memory_lines(report: dict[str, Any]) -> list[str]:
    lines = ["Memory recall in the latest requests:"]
    for r in report["recent"]:
        said = _memory_line(r)
        if said is not None:
            lines.append(f"- {r['id']} {r['at']}: {said}")
    if len(lines) == 1:
        lines.append("- none recalled (no memories, or no user turn that asked)")
    return lines + (_recommendation_lines(report) or ["No budget recommendations yet."])


def _request_lines(report: dict[str, Any]) -> list[str]:
    lines = ["Recent requests:"] if report["recent"] else []
    for r in report["recent"]:
        flags = "on" if r["enabled"] else "off"
        lines.append(
            f"- {r['id']} {r['at']} {r.get('model') or '?'} ({wire_label(r.get('wire'))}) "
            f"[{flags}] HTTP {r['status']}: "
            + (f"saved {money(r['netSavedUsd'])} net; " if r.get("netSavedUsd") is not None else "")
            + f"{r['clamped']} clamped, removed {_n(r['savedChars'])} chars "
            f"(~{_n(r['savedTokens'])} tokens, {money(r['savedUsd'])} gross)"
            + (f", would save {_n(r['wouldSaveChars'])} chars" if r["wouldSaveChars"] else "")
        )
        if r.get("note"):
            lines.append(f"  note: {r['note']}")
        said = _memory_line(r)
        if said is not None:
            lines.append(f"  {said}")
        if r.get("pruneSkipped"):
            lines.append(f"  pruning: {r['pruneSkipped']}")
        if r.get("clampError"):
            lines.append(f"  ⚠ clamp error, forwarded untouched: {r['clampError']}")
        if r.get("cacheBust"):
            lines.append(f"  ⚠ cache bust caused by ctxbudget: {r['cacheBust']}")
        for seg in r["segments"]:
            note = f" ({seg['note']})" if seg.get("note") else ""
            how = f" by {seg['strategy']}" if seg.get("strategy") else ""
            lines.append(
                f"  - {seg['kind']} {seg['label']}: {_n(seg['before'])} → {_n(seg['after'])} "
                f"{seg['action']}{how}{note}"
            )
    return lines
