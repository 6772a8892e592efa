"""The report's window (issue 12, item 1): every restart and instance, `?since=` on the route,
`--since` on the CLI, and a line that says what the totals cover."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.report.render import money
from tests.inproc import config_for, proxy_app
from tests.openclaw import openclaw_request
from tests.proxy.test_cli import Dirs, dirs, run, write_config  # noqa: F401 (a fixture)


def test_a_restart_keeps_the_history_and_since_narrows_it(tmp_path: Path) -> None:
    config = config_for(tmp_path)
    body = openclaw_request(stream=False)
    with proxy_app(tmp_path, config, run="first") as (client, _):
        assert client.post("/v1/chat/completions", json=body).status_code == 200
    with proxy_app(tmp_path, config, run="second") as (client, _):  # the proxy restarted
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        report = client.get("/context/budget").json()
        assert report["totals"]["requests"] == 2 and len(report["recent"]) == 2
        assert report["window"] == {
            "since": report["since"],
            "all": True,
            "keepDays": 90.0,
            "runs": 2,
        }
        text = client.get("/context/budget", params={"format": "text"}).text
        assert "(all that is kept: report.keepDays 90 days, 2 proxy starts): 2 requests" in text
        recent = client.get("/context/budget", params={"since": "1h"}).json()
        assert recent["totals"]["requests"] == 2 and recent["window"]["all"] is False
        future = client.get("/context/budget", params={"since": "2099-01-01"}).json()
        assert future["totals"]["requests"] == 0 and future["recent"] == []
        bad = client.get("/context/budget", params={"since": "yesterday"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "since"
        assert "24h, 30m, 7d or 2w" in bad.json()["error"]["message"]


def test_report_since_on_the_command_line(dirs: Dirs, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    config = write_config(dirs.work / "ctxbudget.jsonc", dirs)
    code, out, err = run(capsys, "report", "--json", "--since", "24h", "--config", str(config))
    assert code == 0 and json.loads(out)["window"]["all"] is False
    code, out, err = run(capsys, "report", "--since", "soon", "--config", str(config))
    assert code == 1 and "--since: since must be a duration such as 24h" in err


def test_saved_and_would_save_are_kept_apart_and_labelled(tmp_path: Path) -> None:
    """Issue 12, item 2: one request clamped, one with the budget off."""
    body = openclaw_request(stream=False, model="gpt-4o")  # priced: the page's chart is in $
    with proxy_app(tmp_path) as (client, _):
        client.post("/v1/chat/completions", json=body)
        client.post("/v1/chat/completions", json=body, headers={"x-context-budget": "off"})
        report = client.get("/context/budget").json()
        text = client.get("/context/budget", params={"format": "text"}).text
        page = client.get("/context/budget", params={"format": "html"}).text
    web = report["totals"]["byKind"]["web_fetch"]
    assert web["savedChars"] > 0 and web["wouldSaveChars"] == web["savedChars"]
    assert web["charsAfter"] == web["charsBefore"] - web["savedChars"]  # what was sent
    assert web["charsAfterWithBudget"] == web["charsBefore"] - 2 * web["savedChars"]
    line = next(x for x in text.splitlines() if x.startswith("- web fetch:") and "seen" in x)
    assert f"{web['charsBefore']:,} → {web['charsAfter']:,} chars sent" in line
    assert f"removed {web['savedChars']:,} chars" in line
    assert f"would save {web['wouldSaveChars']:,} more with the budget on" in line
    # the page's chart is in money (issue 36): the would-save apart, dashed, labelled gross
    would = sum(r["wouldSaveUsd"] or 0 for r in report["recent"])
    assert would > 0 and f"(+{money(would)} gross, at the input price)" in page
    assert "id='saved-line'" in page and "id='would-line'" in page
