"""`GET /metrics`: the Prometheus text of the report's counters and histograms.

`Metrics` is a sink of the report store (`proxy/report/metrics.py`); this is only its door:
who may read it (anyone while access is open, else the metrics key or the admin key) and the
format the scraper asks (OpenMetrics or the classic text).
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response

from ctxbudget.proxy.access.auth import check_metrics_reader
from ctxbudget.proxy.report.metrics import Metrics
from ctxbudget.proxy.state import ProxyState


class MetricsPage:
    """The `/metrics` route of one app's `Metrics`."""

    def __init__(self, state: ProxyState, metrics: Metrics) -> None:
        self.state = state
        self.metrics = metrics

    async def prometheus(self, request: Request) -> Response:
        check_metrics_reader(request.headers, self.state.settings())
        # off the loop: with several workers it reads every worker's files
        body, content_type = await asyncio.to_thread(
            self.metrics.render, request.headers.get("accept", "")
        )
        return Response(body, headers={"content-type": content_type})
