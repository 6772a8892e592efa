"""The report: what every request clamped, injected and saved.

`store` keeps it (SQLite, one writer thread), `summary` reads totals back, `render` builds the
JSON and the text, `page` the HTML page; `record` is one request.
"""

from ctxbudget.proxy.report.record import RequestRecord, report_entry, usd
from ctxbudget.proxy.report.render import build_report, money, render_text
from ctxbudget.proxy.report.store import SCHEMA_VERSION, ReportStore, Sink, open_db, start_run
from ctxbudget.proxy.report.summary import read_summary

__all__ = [
    "ReportStore",
    "RequestRecord",
    "SCHEMA_VERSION",
    "Sink",
    "build_report",
    "money",
    "open_db",
    "read_summary",
    "render_text",
    "report_entry",
    "start_run",
    "usd",
]
