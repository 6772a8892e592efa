"""The app in-process (ASGI), for what the real server cannot be made to do on demand."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from caps import ClampResult
from proxy.app import create_app
from proxy.config import ConfigSource
from proxy.report import ReportStore
from tests.openclaw import openclaw_request
from tests.standin import StandIn, run_standin, serve_app


@pytest.fixture(scope="module")
def standin() -> Iterator[StandIn]:
    with run_standin() as server:
        yield server


def _broken_clamp(request: dict[str, Any], caps: Any, *, tools: Any) -> ClampResult:
    raise RuntimeError("boom in a clamp")


def _app(tmp_path: Path, standin: StandIn, *, fail_closed: bool) -> Any:
    path = tmp_path / "c.json"
    config = {
        "proxy": {"upstream": {"baseUrl": standin.base_url}},
        "agents": {"defaults": {"contextBudget": {"enabled": True, "failClosed": fail_closed}}},
        "report": {"path": str(tmp_path / "r.db")},
    }
    path.write_text(json.dumps(config))
    source = ConfigSource(path, {}, {})
    reports = ReportStore(tmp_path / "r.db", run="t")
    return serve_app(create_app(source, reports=reports, env={}, clamp=_broken_clamp))


def test_clamp_error_fails_open_and_is_reported(tmp_path: Path, standin: StandIn) -> None:
    standin.reset()
    body = openclaw_request(version="9.x", stream=False)
    with (
        _app(tmp_path, standin, fail_closed=False) as port,
        httpx.Client(base_url=f"http://127.0.0.1:{port}") as client,
    ):
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200
        assert r.headers["x-context-budget-clamp-error"] == "forwarded-untouched"
        assert standin.received[-1].json == body
        report = client.get("/context/budget").json()
    assert report["totals"]["clampErrors"] == 1
    assert report["recent"][0]["clampError"] == "RuntimeError: boom in a clamp"


def test_clamp_error_fails_closed_when_configured(tmp_path: Path, standin: StandIn) -> None:
    standin.reset()
    with _app(tmp_path, standin, fail_closed=True) as port:
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions", json=openclaw_request(version="9.x")
        )
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "clamp_failed"
    assert "failClosed is true, so nothing was sent upstream" in r.json()["error"]["message"]
    assert standin.received == []
