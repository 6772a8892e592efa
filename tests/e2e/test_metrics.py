"""`GET /metrics` from `ctxbudget serve --workers 2`: every scrape shows the whole server,
whichever worker answers it."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.server import base_config, serve
from tests.openclaw import openclaw_request
from tests.standin import StandIn


def _totals(text: str) -> tuple[float, float]:
    """(requests, chars saved) summed over every label."""
    requests = chars = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "ctxbudget_requests_total":
                requests += s.value
            elif s.name == "ctxbudget_chars_saved_total":
                chars += s.value
    return requests, chars


def test_every_workers_scrape_adds_up_all_workers(tmp_path: Path, standin: StandIn) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    config = base_config(tmp_path, standin.base_url)
    with serve(tmp_path, config, workers=2, env={"TMPDIR": str(scratch)}) as server:
        shared = list(scratch.glob("ctxbudget-metrics-*"))
        assert len(shared) == 1, "serve makes one directory for the workers to share"
        with httpx.Client() as http:
            for _ in range(30):
                r = http.post(
                    f"{server.base_url}/chat/completions",
                    json=openclaw_request(version="9.x", stream=False),
                    headers={"connection": "close"},  # new connection: spread over workers
                )
                assert r.status_code == 200
            deadline = time.monotonic() + 5
            report = server.report()
            while report["totals"]["requests"] < 30 and time.monotonic() < deadline:
                time.sleep(0.05)
                report = server.report()
            assert len({r["worker"] for r in report["recent"]}) == 2, "both workers served"
            saved = report["totals"]["savedChars"]
            assert saved > 0
            for _ in range(10):  # new connections: answered by one worker or the other
                r = http.get(f"{server.root}/metrics", headers={"connection": "close"})
                assert r.status_code == 200
                assert _totals(r.text) == (30, saved)
    assert list(scratch.iterdir()) == [], "the shared directory is removed at exit"
