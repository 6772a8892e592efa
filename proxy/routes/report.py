"""The report routes: `GET /context/budget` (JSON, text, the chat-sized summary or the page)
and one request's record.

With `proxy.keys`, a key is needed to read them (the page also takes HTTP Basic, so a browser
can ask for it).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response

from ctxbudget.memory.monitor import Monitor, analysis
from ctxbudget.proxy.access.auth import report_viewer
from ctxbudget.proxy.config.settings import Settings
from ctxbudget.proxy.errors import BadRequest, NotFound
from ctxbudget.proxy.report import build_report
from ctxbudget.proxy.report.holdout import comparison
from ctxbudget.proxy.report.page import render_html
from ctxbudget.proxy.report.render import TEXT_SECTIONS, render_summary, render_text
from ctxbudget.proxy.report.summary import parse_since
from ctxbudget.proxy.state import ProxyState

ANALYSIS_DAYS = 7.0
"""Window of the `analyze` recommendations in the report."""
PAGE_REQUESTS = 200
"""Latest requests on the report page (its savings-over-time plot)."""
READ_LATE = 2.0
"""How long a report read waits for records still waiting for a large block's token count
(`ReportStore.add`): one 30 MB body's count takes ~1.5 s; a burst of them must not hold the
report page (it shows them a moment later)."""


def report_analysis(monitor: Monitor, settings: Settings, owner: str | None) -> dict[str, Any]:
    """The report's `analysis`: `ctxbudget analyze`'s recommendations over the last
    `ANALYSIS_DAYS` (the server and `ctxbudget report` both)."""
    return analysis(
        monitor,
        settings.recall.budget_profiles,
        days=ANALYSIS_DAYS,
        owner=owner,
        agents=settings.recall.agents,
        default_profile=settings.recall.default_budget_profile,
    )


def page_url(host: str, port: int) -> str:
    """The report page of a server listening on `host`:`port`, as a browser on this machine
    reaches it (a wildcard address is reached on loopback)."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else "[::1]" if host == "::" else host
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/context/budget"


class Reporting:
    """Builds the report from the store and serves it."""

    def __init__(self, state: ProxyState) -> None:
        self.state = state

    async def report(
        self,
        settings: Settings,
        request: Request,
        *,
        owner: str | None,
        recent: int | None = None,
        since: float | None = None,
    ) -> dict[str, Any]:
        """The report dict (JSON, text, page and the chat command all render this): `owner`'s
        requests only, or everyone's when None."""
        state = self.state

        # Waiting for the writer and reading SQLite block: keep them off the event loop. So
        # does the holdout's comparison: it walks every conversation with an arm (one per new
        # session id a key sends, kept `report.keepDays`), ~1 s per 100,000 on the loop.
        def read() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
            state.reports.flush(late=READ_LATE)
            summary = state.reports.summary(
                recent=recent or settings.recent_requests, owner=owner, since=since
            )
            analysis = report_analysis(state.stores.store(settings).monitor, settings, owner)
            arms = state.reports.holdout_rows(owner=owner, since=since)
            return summary, analysis, comparison(arms, share=settings.holdout, now=time.time())

        summary, found, holdout = await asyncio.to_thread(read)
        report = build_report(summary, settings=settings.report_section(state.config))
        for session in report.get("sessions") or []:
            # the guard on the measured bill lives in this process's cache mirrors: a session
            # another instance serves says nothing here
            paused = state.mirrors.paused(owner, str(session.get("id")))
            if paused is not None:
                session["pruningPaused"] = paused
        report["analysis"] = found
        # a key sees its own conversations' arms and numbers only (`owner`)
        if holdout is not None:
            report["holdout"] = holdout
        report["page"] = str(request.base_url).rstrip("/") + "/context/budget"
        return report

    async def budget(self, request: Request) -> Response:
        settings = self.state.settings()
        fmt = request.query_params.get("format")
        accept = request.headers.get("accept", "")
        if fmt is None and "json" not in accept:
            # a browser asks for text/html first; curl and SDKs for */* or JSON
            fmt = "html" if "text/html" in accept else "text" if "text/plain" in accept else None
        # the key first, as on every route: a caller without one learns nothing of the query
        owner = report_viewer(request.headers, settings, browser=fmt == "html")
        if fmt not in (None, "json", "text", "summary", "html"):
            raise BadRequest(
                f"format must be 'json', 'text', 'summary' or 'html', got {fmt!r}",
                param="format",
            )
        section = request.query_params.get("section")
        if section is not None:  # one part of the text (`/context budget full <section>`)
            if section not in TEXT_SECTIONS:
                raise BadRequest(
                    f"section must be one of {', '.join(TEXT_SECTIONS)}; got {section[:40]!r} "
                    "(without it, format=text is the whole report)",
                    param="section",
                )
            if fmt not in (None, "text"):
                raise BadRequest(
                    f"section is a part of the text report: use it with format=text, not {fmt!r}",
                    param="section",
                )
            fmt = "text"
        since = _since(request.query_params.get("since"))
        if fmt == "html":
            report = await self.report(
                settings, request, owner=owner, recent=PAGE_REQUESTS, since=since
            )
            return HTMLResponse(render_html(report), headers=_NO_FRAMES)
        report = await self.report(settings, request, owner=owner, since=since)
        if fmt == "text":
            return PlainTextResponse(render_text(report, section))
        if fmt == "summary":  # the chat-sized one, as `/context budget` answers
            return PlainTextResponse(render_summary(report))
        return JSONResponse(report)

    async def budget_request(self, request: Request) -> Response:
        settings = self.state.settings()
        owner = report_viewer(request.headers, settings)
        request_id = request.path_params["id"]
        reports = self.state.reports

        def read() -> dict[str, Any] | None:
            reports.flush(late=READ_LATE)
            return reports.request(request_id, owner=owner)  # another key's: not found

        found = await asyncio.to_thread(read)
        if found is None:
            raise NotFound(
                f"no request {request_id!r} in the report (it keeps the latest ones; "
                "ids come from the x-context-budget-request-id header)",
                param="id",
            )
        return JSONResponse(found)


_NO_FRAMES = {"x-frame-options": "DENY", "content-security-policy": "frame-ancestors 'none'"}
"""The page is never shown inside another site's frame: a page that framed it could dress
the user's own report (their sessions, URLs, paths) as its content or lure clicks onto it.
Both headers: `frame-ancestors` where CSP is honoured, `X-Frame-Options` for older browsers."""


def _since(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_since(value)
    except ValueError as exc:
        raise BadRequest(str(exc), param="since") from None
