"""The report as a self-contained HTML page: inline CSS and server-drawn SVG, no script, no CDN.

Rendered from the same report dict as the JSON and the text (`proxy/report/render.py`), so the three
agree figure for figure. Every figure a test compares carries `data-figure="<path>"` with the
JSON value in `data-value`.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from html import escape
from typing import Any

from ctxbudget.proxy.report.render import (
    KIND_TITLES,
    MINUS,
    NET_ABOVE_GROSS,
    change_text,
    measured_text,
    money,
    net_above_gross,
    net_text,
    no_recommendations,
    profile_of,
    tools_inline_text,
    window_text,
    wire_label,
)

_CSS = """
:root { --fg:#1d232b; --muted:#5b6675; --line:#d8dee6; --bg:#f6f8fa; --before:#c3ccd7;
        --after:#2f7d5b; --warn:#b35900; --bad:#b3261e; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg);
       margin: 0; background: var(--bg); }
main { max-width: 1100px; margin: 0 auto; padding: 24px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 28px 0 10px; }
header { margin-bottom: 20px; }
.sub { color: var(--muted); }
.badge { display:inline-block; padding:2px 8px; border-radius:10px; font-weight:600;
         font-size:12px; vertical-align:middle; }
.on { background:#d9f2e4; color:#1b5e3f; } .off { background:#eceff3; color:#4a5563; }
.cards { display:grid; grid-template-columns:repeat(auto-fit,minmax(170px,1fr)); gap:12px; }
.card { background:#fff; border:1px solid var(--line); border-radius:8px; padding:12px; }
.card .v { font-size:22px; font-weight:650; } .card .k { color:var(--muted); font-size:12px; }
.card.net { border-color:var(--after); grid-column: span 2; } .card.net .v { font-size:28px; }
table { border-collapse:collapse; width:100%; background:#fff; border:1px solid var(--line); }
th, td { text-align:left; padding:6px 8px; border-bottom:1px solid var(--line);
         vertical-align:top; }
th { font-size:12px; color:var(--muted); font-weight:600; background:#fbfcfd; }
td.n, th.n { text-align:right; font-variant-numeric: tabular-nums; }
.seg { font-size:12px; color:var(--muted); margin:2px 0 0; padding-left:16px; }
.seg li { margin:1px 0; } code { font-size:12px; word-break:break-all; }
.panel { background:#fff; border:1px solid var(--line); border-radius:8px; padding:12px; }
.warn { color:var(--warn); } .bad { color:var(--bad); }
svg text { font: 12px system-ui, sans-serif; fill: var(--fg); } svg text.sub { fill: var(--muted); }
.legend span { display:inline-block; width:10px; height:10px; margin:0 4px 0 12px; }
"""


def render_html(report: dict[str, Any]) -> str:
    """The whole page for `report` (as built by `proxy.report.render.build_report`)."""
    totals = report["totals"]
    on = report["enabled"]
    config = report["config"]
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        "<title>ctxbudget — context budget report</title>",
        f"<style>{_CSS}</style></head><body><main><header id='head'>",
        "<h1>Context budget "
        f"<span id='status' class='badge {'on' if on else 'off'}'>{'ON' if on else 'OFF'}</span>"
        "</h1>",
        f"<div class='sub'>Config {escape(config['path'] or 'built-in defaults')} (loaded "
        f"{escape(config['loadedAt'])}) · {escape(window_text(report))} · generated "
        f"{escape(report['generatedAt'])} · chars in UTF-16 code units, tokens by "
        f"{escape(report['encoding'])} for unknown models</div>",
    ]
    if config.get("error"):
        parts.append(
            f"<p class='bad'>Config error, the last good config is still in force: "
            f"{escape(config['error'])}</p>"
        )
    parts.append("</header>")
    parts.append(_cards(totals))
    parts.append(_holdout(report.get("holdout")))
    if net_above_gross(report):
        parts.append(f"<p class='sub' id='net-above-gross'>{escape(NET_ABOVE_GROSS)}.</p>")
    parts.append(_caps(report["caps"]))
    parts.append(_kinds(totals))
    parts.append(_sessions(totals.get("money"), report.get("sessions") or []))
    parts.append(_over_time(report["recent"]))
    parts.append(_requests(report["recent"]))
    parts.append(_memory(report["recent"]))
    parts.append(_monitor(report))
    parts.append("</main></body></html>")
    return "".join(parts)


def _figure(path: str, value: Any, shown: str) -> str:
    raw = "" if value is None else str(value)
    return f"<span data-figure='{escape(path)}' data-value='{escape(raw)}'>{escape(shown)}</span>"


def _count(path: str, value: int) -> str:
    """A count, marked as the figure at `path`."""
    return _figure(path, value, _n(value))


def _n(value: int) -> str:
    return f"{value:,}"


def _net_card(t: dict[str, Any]) -> str:
    """The headline card: the money saved net of cache effects (the sessions' `savedUsd`)."""
    money_totals = t.get("money") or {}
    saved = money_totals.get("savedUsd")
    shown = money(saved) if saved is not None else "unknown"
    loss = money(saved).startswith(MINUS) if saved is not None else False
    if saved is None:
        said = net_text(money_totals, t["requests"])
    else:
        said = (
            f"over {money_totals['sessions']:,} session"
            f"{'' if money_totals['sessions'] == 1 else 's'}: billed "
            f"{money(money_totals['costUsd'])}, {money(money_totals['withoutCtxbudgetUsd'])} "
            "without ctxbudget" + (" — ctxbudget cost more than it saved" if loss else "")
        )
    return (
        f"<div class='card net' id='net-card'><div class='k'>Saved, net of cache effects</div>"
        f"<div class='v{' bad' if loss else ''}'>"
        f"{_figure('totals.money.savedUsd', saved, shown)}</div>"
        f"<div class='k'>{escape(said)}</div></div>"
    )


def _cards(t: dict[str, Any]) -> str:
    cards = [
        ("Requests", _figure("totals.requests", t["requests"], _n(t["requests"]))),
        ("Segments clamped", _figure("totals.clamped", t["clamped"], _n(t["clamped"]))),
        (
            "Chars removed (gross)",
            _figure("totals.savedChars", t["savedChars"], _n(t["savedChars"])),
        ),
        (
            "Tokens removed (gross)",
            _figure("totals.savedTokens", t["savedTokens"], _n(t["savedTokens"])),
        ),
        (
            "Gross: removed tokens at input price",
            _figure("totals.savedUsd", t["savedUsd"], money(t["savedUsd"])),
        ),
    ]
    if t["wouldSaveChars"]:
        cards.append(
            (
                "Would remove (budget off, gross)",
                _figure("totals.wouldSaveChars", t["wouldSaveChars"], _n(t["wouldSaveChars"]))
                + " chars",
            )
        )
    html = _net_card(t) + "".join(
        f"<div class='card'><div class='k'>{escape(k)}</div><div class='v'>{v}</div></div>"
        for k, v in cards
    )
    note = ""
    if t["unpricedRequests"]:
        note = (
            f"<p class='sub'>{_n(t['unpricedRequests'])} request(s) for models without a price "
            "in litellm's map: their savings count in tokens only.</p>"
        )
    if t["clampErrors"]:
        note += (
            f"<p class='warn'>{_n(t['clampErrors'])} request(s) forwarded untouched after a "
            "clamp error.</p>"
        )
    return f"<div class='cards' id='totals'>{html}</div>{note}"


def _caps(caps: dict[str, Any]) -> str:
    rows = []
    for kind, cap in caps.items():
        value = "no limit" if cap["value"] is None else _n(cap["value"])
        rows.append(
            f"<tr><td>{escape(KIND_TITLES.get(kind, kind))}</td>"
            f"<td class='n'>{_figure(f'caps.{kind}.value', cap['value'], value)}</td>"
            f"<td>{escape(str(cap['source']))}</td><td><code>{escape(str(cap['from']))}</code>"
            "</td></tr>"
        )
    return (
        "<h2>Effective caps</h2><table id='caps'><tr><th>kind</th><th class='n'>cap (chars)</th>"
        f"<th>set by</th><th>origin</th></tr>{''.join(rows)}</table>"
    )


def _kinds(t: dict[str, Any]) -> str:
    kinds = t["byKind"]
    top = max([k["charsBefore"] for k in kinds.values()] + [1])
    width, label_w, row_h = 720, 130, 46
    bars = []
    for i, (kind, k) in enumerate(kinds.items()):
        y = 10 + i * row_h
        before = k["charsBefore"] / top * (width - label_w - 90)
        after = k["charsAfter"] / top * (width - label_w - 90)  # as sent
        bars.append(
            f"<text x='0' y='{y + 17}'>{escape(KIND_TITLES.get(kind, kind))}</text>"
            f"<rect x='{label_w}' y='{y}' width='{before:.1f}' height='16' fill='var(--before)'>"
            f"<title>before: {_n(k['charsBefore'])} chars</title></rect>"
            f"<text x='{label_w + before + 6:.1f}' y='{y + 13}'>{_n(k['charsBefore'])}</text>"
            f"<rect x='{label_w}' y='{y + 18}' width='{after:.1f}' height='16' "
            f"fill='var(--after)'><title>sent: {_n(k['charsAfter'])} chars</title></rect>"
            f"<text x='{label_w + after + 6:.1f}' y='{y + 31}'>{_n(k['charsAfter'])}</text>"
        )
    height = 10 + len(kinds) * row_h
    rows = "".join(
        f"<tr><td>{escape(KIND_TITLES.get(kind, kind))}</td>"
        f"<td class='n'>{_figure(f'totals.byKind.{kind}.seen', k['seen'], _n(k['seen']))}</td>"
        f"<td class='n'>{_figure(f'totals.byKind.{kind}.clamped', k['clamped'], _n(k['clamped']))}"
        "</td><td class='n'>"
        f"{_figure(f'totals.byKind.{kind}.charsBefore', k['charsBefore'], _n(k['charsBefore']))}"
        "</td><td class='n'>"
        f"{_figure(f'totals.byKind.{kind}.charsAfter', k['charsAfter'], _n(k['charsAfter']))}"
        "</td><td class='n'>"
        f"{_figure(f'totals.byKind.{kind}.savedChars', k['savedChars'], _n(k['savedChars']))}"
        "</td><td class='n'>"
        f"{_figure(f'totals.byKind.{kind}.savedTokens', k['savedTokens'], _n(k['savedTokens']))}"
        "</td><td class='n'>"
        f"{_figure(f'totals.byKind.{kind}.savedUsd', k['savedUsd'], money(k['savedUsd']))}"
        "</td><td class='n'>"
        f"{_count(f'totals.byKind.{kind}.wouldSaveChars', k['wouldSaveChars'])}"
        "</td></tr>"
        for kind, k in kinds.items()
    )
    return (
        "<h2>Chars before and after, per kind</h2><div class='panel'>"
        f"<svg id='kinds-chart' role='img' aria-label='chars before and after per kind' "
        f"width='100%' viewBox='0 0 {width} {height}'>{''.join(bars)}</svg>"
        "<div class='legend sub'><span style='background:var(--before)'></span>before"
        "<span style='background:var(--after)'></span>sent (what went upstream)</div></div>"
        "<table id='kinds'><tr><th>kind</th><th class='n'>seen</th><th class='n'>clamped</th>"
        "<th class='n'>chars before</th><th class='n'>chars sent</th><th class='n'>chars removed"
        "</th><th class='n'>tokens removed</th><th class='n'>gross at input price</th>"
        "<th class='n'>would save with the budget on (chars)</th></tr>"
        f"{rows}</table>"
    )


def _sessions(money_totals: dict[str, Any] | None, sessions: list[dict[str, Any]]) -> str:
    """The money net of cache effects, and a cost bar per session: with ctxbudget (what the
    provider billed) against without (the estimate with nothing clamped or injected)."""
    head = "<h2>Sessions: what the provider billed, with and without ctxbudget</h2>"
    if not money_totals or not sessions:
        return head + "<p class='sub' id='sessions'>No sessions yet.</p>"
    ratio = money_totals["cacheHitRatio"]
    busts = money_totals["cacheBusts"]
    headline = net_text(money_totals, money_totals["requests"])
    summary = (
        f"<p id='net'>{escape(headline[:1].upper() + headline[1:])} · billed "
        + _figure("totals.money.costUsd", money_totals["costUsd"], money(money_totals["costUsd"]))
        + " · without ctxbudget "
        + _figure(
            "totals.money.withoutCtxbudgetUsd",
            money_totals["withoutCtxbudgetUsd"],
            money(money_totals["withoutCtxbudgetUsd"]),
        )
        + "</p><p class='sub' id='cache-line'>Prompt cache: "
        + _figure("totals.money.cacheHitRatio", ratio, "n/a" if ratio is None else f"{ratio:.0%}")
        + " of input read from the provider's cache · cache busts caused by ctxbudget: "
        + _count("totals.money.cacheBusts.ctxbudget", busts["ctxbudget"])
        + ", by clients: "
        + _count("totals.money.cacheBusts.client", busts["client"])
        + f" · memories injected ~{_n(money_totals['memoryTokens'])} tokens (a cost)</p>"
    )
    top = max(
        [s["withoutCtxbudgetUsd"] or 0 for s in sessions]
        + [s["costUsd"] or 0 for s in sessions]
        + [1e-12]
    )
    # Each session: its name on a line of its own, then its two bars below it, values at
    # their ends: a long session id never runs into a bar (the SVG scales with the page).
    width, row_h, value_w = 720, 64, 110
    bars, rows = [], []
    for i, s in enumerate(sessions):
        y = 8 + i * row_h
        cost, would = s["costUsd"], s["withoutCtxbudgetUsd"]
        name = f"{s['id']} ({wire_label(s['format'])}, {s['model'] or '?'})"
        bars.append(f"<text x='0' y='{y + 12}'>{escape(_short(name, 90))}</text>")
        with_w = (cost or 0) / top * (width - value_w)
        without_w = (would or 0) / top * (width - value_w)
        if cost is None or would is None:
            bars.append(
                f"<text x='0' y='{y + 32}' class='sub'>price unknown: the model is not in "
                "litellm's map (tokens only)</text>"
            )
        else:
            bars.append(
                f"<rect x='0' y='{y + 18}' width='{without_w:.1f}' height='16' "
                "fill='var(--before)'>"
                f"<title>without ctxbudget: {escape(money(would))}</title></rect>"
                f"<text x='{without_w + 6:.1f}' y='{y + 31}'>{escape(money(would))}</text>"
                f"<rect x='0' y='{y + 36}' width='{with_w:.1f}' height='16' fill='var(--after)'>"
                f"<title>billed: {escape(money(cost))}</title></rect>"
                f"<text x='{with_w + 6:.1f}' y='{y + 49}'>{escape(money(cost))}</text>"
            )
        hit = s["cacheHitRatio"]
        at = f"sessions.{i}"
        inline = s.get("toolsInline")
        flag = (
            f" · {_count(f'{at}.toolsInline.count', inline['count'])} MCP tools inline, "
            f"~{_count(f'{at}.toolsInline.tokens', inline['tokens'])} tokens a request"
            if inline
            else ""
        )
        rows.append(
            f"<tr><td><code>{escape(s['id'])}</code><br><span class='sub'>"
            f"{escape(wire_label(s['format']))}, {escape(s['model'] or '?')}{flag}</span></td>"
            f"<td class='n'>{_count(f'{at}.requests', s['requests'])}</td>"
            f"<td class='n'>{_figure(f'{at}.costUsd', cost, money(cost))}</td>"
            f"<td class='n'>{_figure(f'{at}.withoutCtxbudgetUsd', would, money(would))}</td>"
            f"<td class='n'>{_figure(f'{at}.savedUsd', s['savedUsd'], money(s['savedUsd']))}</td>"
            f"<td class='n'>{'n/a' if hit is None else f'{hit:.0%}'}</td>"
            f"<td class='n'>{_count(f'{at}.cacheBusts.ctxbudget', s['cacheBusts']['ctxbudget'])}"
            f" / {_n(s['cacheBusts']['client'])}</td></tr>"
        )
    height = 8 + len(sessions) * row_h
    advice = tools_inline_text(sessions)
    if advice:  # Claude Code's MCP tools inline: what to set, before the money it costs
        summary += f"<p class='bad' id='tools-inline'>{escape(advice)}</p>"
    return (
        head
        + summary
        + "<div class='panel'><svg id='sessions-chart' role='img' aria-label='cost per session "
        f"with and without ctxbudget' width='100%' viewBox='0 0 {width} {height}'>"
        + "".join(bars)
        + "</svg><div class='legend sub'><span style='background:var(--before)'></span>without "
        "ctxbudget (estimate)<span style='background:var(--after)'></span>billed</div></div>"
        "<table id='sessions'><tr><th>session</th><th class='n'>requests</th>"
        "<th class='n'>billed</th><th class='n'>without ctxbudget</th><th class='n'>saved</th>"
        "<th class='n'>cache hits</th><th class='n'>busts: ctxbudget / client</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _holdout(found: dict[str, Any] | None) -> str:
    """The holdout's card (the saving measured on the bill, beside the estimate) and both
    arms' cost per request over time, by the day (or hour) their conversations began."""
    if not found:
        return ""
    measured = measured_text({"holdout": found}) or ""
    arms = found["arms"]
    card = (
        "<h2>Measured on your bill (holdout)</h2><div class='cards' id='holdout'>"
        f"<div class='card net'><div class='k'>Saving per request, measured</div>"
        f"<div class='v'>{_figure('holdout.saving.pct', found['saving']['pct'], _pct(found))}"
        f"</div><div class='k'>{escape(measured)}</div></div>"
        + "".join(
            f"<div class='card'><div class='k'>{arm}: conversations, requests</div>"
            f"<div class='v'>{_count(f'holdout.arms.{arm}.conversations', a['conversations'])}"
            f"</div><div class='k'>{a['requests']:,} requests, {money(a['costUsd'])}, "
            f"{a['turnsPerConversation'] or 0:g} turns a conversation</div></div>"
            for arm, a in arms.items()
        )
        + "</div>"
    )
    points = found.get("series") or []
    if not points:
        return card
    width, height, left, top, bottom = 720, 180, 78, 24, 30
    plot_w, plot_h = width - left - 24, height - top - bottom
    values = [p[a] for p in points for a in arms if p.get(a) is not None]
    high = max(values, default=0.0) or 1.0
    step = plot_w / (len(points) - 1) if len(points) > 1 else 0.0
    lines = []
    for arm, colour in (("budget", "var(--after)"), ("holdout", "var(--before)")):
        # one bucket (the first hour or day) sits mid-chart
        drawn = [
            (left + (i * step if step else plot_w / 2), top + (1 - p[arm] / high) * plot_h, p)
            for i, p in enumerate(points)
            if p.get(arm) is not None
        ]
        shown = " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in drawn)
        lines.append(
            f"<polyline id='arm-{arm}' points='{shown}' fill='none' stroke='{colour}' "
            "stroke-width='2'/>"
        )
        # a mark on each point: a line of one point (an arm's first bucket) draws nothing
        lines.extend(
            f"<circle class='point-{arm}' cx='{x:.1f}' cy='{y:.1f}' r='3.5' fill='{colour}'>"
            f"<title>{arm}, {p['at']}: {money(p[arm])} a request</title></circle>"
            for x, y, p in drawn
        )
    label = f"cost per request by arm, {points[0]['at']} to {points[-1]['at']} (top: {money(high)})"
    return card + (
        "<div class='panel' id='holdout-over-time'><svg role='img' "
        f"aria-label='both arms over time' width='100%' viewBox='0 0 {width} {height}'>"
        + "".join(lines)
        + f"<text x='{left}' y='{top - 8}'>{escape(label)}</text></svg>"
        "<p class='sub'>Solid green: budget; the other: holdout.</p></div>"
    )


def _pct(found: dict[str, Any]) -> str:
    saved = found["saving"]
    if saved["pct"] is None or not saved["enough"]:
        return "not enough data yet"
    return f"{saved['pct']:g}% ({saved['low']:g}–{saved['high']:g}%)"


def _over_time(recent: list[dict[str, Any]]) -> str:
    """Net money saved over time: each request's `netSavedUsd` (its cost without ctxbudget
    minus its cost, the figures the headline sums), cumulative, against the time it came;
    dashed, what the budget would save were it on (gross, at the input price)."""
    points = sorted(recent, key=lambda r: r["at"])
    head = "<h2>Saved over time, net of cache effects (latest requests, cumulative $)</h2>"
    if len(points) < 2:
        return head + "<p class='sub' id='over-time'>Not enough requests yet to draw.</p>"
    net, would, unknown = 0.0, 0.0, 0
    net_series, would_series = [], []
    for r in points:  # kept apart: what was saved, and what the budget would have saved
        if r.get("netSavedUsd") is None:  # no usage read or no price: counts as nothing
            unknown += 1
        else:
            net += r["netSavedUsd"]
        would += r.get("wouldSaveUsd") or 0.0
        net_series.append(net)
        would_series.append(net + would)
    width, height = 720, 220
    left, right, top, bottom = 78, 24, 30, 34
    plot_w, plot_h = width - left - right, height - top - bottom
    low, high, y_ticks = _money_ticks(
        min([0.0, *net_series, *would_series]), max([0.0, *net_series, *would_series])
    )
    times = [_epoch(r["at"]) for r in points]
    span = times[-1] - times[0]

    def x_of(i: int) -> float:  # by time; all in one second: evenly
        share = (times[i] - times[0]) / span if span > 0 else i / (len(points) - 1)
        return left + share * plot_w

    def y_of(v: float) -> float:
        return top + (high - v) / (high - low) * plot_h

    def line(series: list[float]) -> str:
        return " ".join(f"{x_of(i):.1f},{y_of(v):.1f}" for i, v in enumerate(series))

    grid = "".join(
        f"<line x1='{left}' y1='{y_of(v):.1f}' x2='{width - right}' y2='{y_of(v):.1f}' "
        f"stroke='{'var(--line)' if v else 'var(--muted)'}'/>"
        f"<text x='{left - 8}' y='{y_of(v) + 4:.1f}' text-anchor='end' class='y-tick'>"
        f"{escape(shown)}</text>"
        for v, shown in y_ticks
    )
    axis = "".join(
        f"<line x1='{x:.1f}' y1='{top + plot_h}' x2='{x:.1f}' y2='{top + plot_h + 4}' "
        "stroke='var(--muted)'/>"
        f"<text x='{x:.1f}' y='{top + plot_h + 18}' text-anchor='middle' class='x-tick'>"
        f"{escape(shown)}</text>"
        for at, shown in _time_ticks(times[0], times[-1])
        for x in (left + ((at - times[0]) / span if span > 0 else 0.0) * plot_w,)
    )
    label = f"saved {money(net)} net over {len(points)} requests (times in UTC)"
    if unknown:
        label += f"; {unknown} without a price or usage count as $0"
    note = (
        f"<p class='sub'>Dashed: {money(net + would)} had the budget been on "
        f"(+{money(would)} gross, at the input price).</p>"
        if would
        else ""
    )
    return (
        head + "<div class='panel' id='over-time'>"
        f"<svg id='over-time-chart' role='img' aria-label='net money saved over time' "
        f"width='100%' viewBox='0 0 {width} {height}'>{grid}{axis}"
        f"<polyline id='saved-line' points='{line(net_series)}' data-value='{net!r}' "
        "fill='none' stroke='var(--after)' stroke-width='2'/>"
        + (
            f"<polyline id='would-line' points='{line(would_series)}' fill='none' "
            "stroke='var(--before)' stroke-width='2' stroke-dasharray='6 4'/>"
            if would
            else ""
        )
        + f"<text x='{left}' y='{top - 12}'>{escape(label)}</text></svg>{note}</div>"
    )


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


_TIME_STEPS: tuple[int, ...] = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600)
_TIME_STEPS += (7200, 10800, 21600, 43200, 86400, 172800, 604800, 1209600, 2592000, 7776000)
MAX_TICKS = 6
"""Most time labels under the savings chart: ~100 px each on its 620 px axis."""


def _time_ticks(start: float, end: float) -> list[tuple[float, str]]:
    """Round times between `start` and `end` (epoch seconds) with their UTC labels, at most
    `MAX_TICKS`, no label twice: seconds for a span under minutes, hours and minutes within
    days, the date past that; a tick on a new day names the day.

    >>> [t for _, t in _time_ticks(0, 20)]
    ['00:00:00', '00:00:05', '00:00:10', '00:00:15', '00:00:20']
    >>> [t for _, t in _time_ticks(82_800, 97_200)]
    ['23:00', 'Jan 02 00:00', '01:00', '02:00', '03:00']
    >>> [t for _, t in _time_ticks(5.2, 5.7)]
    ['00:00:05']
    """
    span = end - start
    if span < 1:  # all in one second: that second, once
        return [(start, _clock_label(start, 1, None))]
    step = next((s for s in _TIME_STEPS if span / s < MAX_TICKS), _TIME_STEPS[-1])
    ticks, shown, day = [], set(), None
    at = math.ceil(start / step) * step
    while at <= end:
        label = _clock_label(at, step, day)
        day = datetime.fromtimestamp(at, UTC).date()
        if label not in shown:
            shown.add(label)
            ticks.append((float(at), label))
        at += step
    return ticks


def _clock_label(at: float, step: float, day: Any) -> str:
    when = datetime.fromtimestamp(at, UTC)
    if step >= 86_400:
        return when.strftime("%b %d")
    clock = when.strftime("%H:%M:%S" if step < 60 else "%H:%M")
    return when.strftime("%b %d ") + clock if day is not None and when.date() != day else clock


def _money_ticks(low: float, high: float) -> tuple[float, float, list[tuple[float, str]]]:
    """The y range for amounts from `low` to `high` (0 within it), and its round ticks with
    their labels, 3-6 of them.

    >>> _money_ticks(0.0, 0.0339)[2]
    [(0.0, '$0.00'), (0.01, '$0.01'), (0.02, '$0.02'), (0.03, '$0.03'), (0.04, '$0.04')]
    >>> [t for _, t in _money_ticks(-0.00002, 0.00006)[2]]
    ['−$0.00002', '$0.00000', '$0.00002', '$0.00004', '$0.00006']
    """
    if high - low <= 0:
        high = low + 0.01
    raw = (high - low) / 4
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first, last = math.floor(low / step), math.ceil(high / step)
    digits = max(2, -math.floor(math.log10(step)))
    ticks = []
    for k in range(first, last + 1):
        v = round(k * step, digits + 2)
        shown = f"${abs(v):,.{digits}f}"
        ticks.append((v, MINUS + shown if v < 0 else shown))
    return first * step, last * step, ticks


def _requests(recent: list[dict[str, Any]]) -> str:
    rows = []
    for r in recent:
        # a kept segment with a note is one a user expected clamped (an unwrapped web page
        # over its cap): the text report lists it, and so must the page
        segs = [s for s in r["segments"] if s["action"] != "kept" or s.get("note")]
        detail = "".join(
            f"<li>{escape(s['kind'])} <code>{escape(s['label'])}</code>: "
            f"{_n(s['before'])} → {_n(s['after'])} {escape(s['action'])}"
            + (f" <span class='sub'>({escape(s['note'])})</span>" if s.get("note") else "")
            + "</li>"
            for s in segs
        )
        error = ""
        if r.get("clampError"):
            error = f"<div class='warn'>clamp error: {escape(r['clampError'])}</div>"
        if r.get("upstreamError"):
            error += f"<div class='bad'>upstream: {escape(r['upstreamError'])}</div>"
        if r.get("note"):
            error += f"<div class='sub'>{escape(r['note'])}</div>"
        rid = r["id"]
        rows.append(
            f"<tr data-request='{escape(rid)}'><td>{escape(r['at'])}<br><code>{escape(rid)}"
            f"</code></td><td>{escape(r.get('model') or '?')}<br>"
            f"<span class='sub'>{escape(wire_label(r.get('wire')))}</span></td>"
            f"<td class='n'>{r['status']}</td><td class='n'>"
            f"{_figure(f'recent.{rid}.netSavedUsd', r.get('netSavedUsd'), _net(r))}</td>"
            f"<td class='n'>{_figure(f'recent.{rid}.clamped', r['clamped'], _n(r['clamped']))}"
            "</td><td class='n'>"
            f"{_figure(f'recent.{rid}.savedChars', r['savedChars'], _n(r['savedChars']))}"
            + (
                f" <span class='sub'>(would save "
                f"{_count(f'recent.{rid}.wouldSaveChars', r['wouldSaveChars'])})"
                "</span>"
                if r["wouldSaveChars"]
                else ""
            )
            + "</td>"
            "<td class='n'>"
            f"{_figure(f'recent.{rid}.savedTokens', r['savedTokens'], _n(r['savedTokens']))}"
            f"</td><td class='n'>"
            f"{_figure(f'recent.{rid}.savedUsd', r['savedUsd'], money(r['savedUsd']))}"
            f"</td><td>{error}<ul class='seg'>{detail}</ul></td></tr>"
        )
    body = "".join(rows) or "<tr><td colspan='9' class='sub'>No requests yet.</td></tr>"
    return (
        "<h2>Latest requests and their clamps</h2><table id='requests'><tr><th>when / id</th>"
        "<th>model</th><th class='n'>status</th><th class='n'>saved, net</th>"
        "<th class='n'>clamped</th>"
        "<th class='n'>chars removed</th><th class='n'>tokens removed</th>"
        "<th class='n'>gross at input price</th>"
        f"<th>clamps: file, tool or URL, before → after</th></tr>{body}</table>"
    )


def _net(r: dict[str, Any]) -> str:
    """A request's net saving as shown: unknown without the provider's usage or a price."""
    net = r.get("netSavedUsd")
    return "unknown" if net is None else money(net)


def _memory(recent: list[dict[str, Any]]) -> str:
    rows = []
    for r in recent:
        m = r.get("memory")
        if not m:
            continue
        budget = m.get("budget") or {}
        rows.append(
            f"<tr><td><code>{escape(r['id'])}</code></td>"
            f"<td>{escape(str(m['requested']))} → <b>{escape(m['applied'])}</b><br>"
            f"<span class='sub'>{escape(m['reason'])}</span></td>"
            f"<td class='n'>{m['candidates']}</td><td class='n'>{m['injected']}</td>"
            f"<td class='n'>{_n(m['tokens'])}</td><td>{escape(m['boundBy'])}</td>"
            f"<td>{escape(str(budget.get('boundBy', '')))}</td></tr>"
        )
    if not rows:
        return "<h2>Memory injection</h2><p class='sub' id='memory'>No memories injected yet.</p>"
    return (
        "<h2>Memory injection</h2><table id='memory'><tr><th>request</th>"
        "<th>profile requested → applied, and why</th><th class='n'>candidates</th>"
        "<th class='n'>injected</th><th class='n'>tokens</th><th>packing bound by</th>"
        f"<th>budget bound by</th></tr>{''.join(rows)}</table>"
    )


def _monitor(report: dict[str, Any]) -> str:
    warnings = [
        (r["id"], w)
        for r in report["recent"]
        for w in ((r.get("memory") or {}).get("usage") or {}).get("warnings", [])
    ]
    items = "".join(
        f"<li class='{'bad' if w.startswith('exceeded') else 'warn'}'><code>{escape(rid)}</code> "
        f"{escape(w)}</li>"
        for rid, w in warnings
    )
    analysis = report.get("analysis") or {}
    recs = "".join(
        f"<li><b>{escape(str(r['agent']))}</b> ({escape(profile_of(r))}): "
        f"{escape(change_text(r))} — "
        f"{escape(str(r['reason']))} "
        f"(confidence {float(r['confidence']):.2f})</li>"
        for r in analysis.get("recommendations", [])
    )
    days = analysis.get("days", 7)
    return (
        "<h2>Budget monitor</h2><div class='panel' id='monitor'>"
        + (f"<ul>{items}</ul>" if items else "<p class='sub'>No warnings in these requests.</p>")
        + f"<h2>Recommendations (ctxbudget analyze, last {days:g} days)</h2>"
        + (
            f"<ul id='recommendations'>{recs}</ul>"
            if recs
            else f"<p class='sub' id='recommendations'>{escape(no_recommendations(analysis))}</p>"
        )
        + "</div>"
    )
