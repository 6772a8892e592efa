"""The report page in a real browser (Debian's headless Chromium), after real traffic.

Also: the page, the JSON report and the `/context budget` chat command agree figure for figure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from ctxbudget.proxy.report.render import MINUS, money
from tests.e2e.conversations import replay, settled
from tests.e2e.server import CTXBUDGET, base_config, sdk, serve, standin_config
from tests.openclaw import openclaw_request
from tests.replay import Schedule
from tests.simclock import ClockFile
from tests.standin import StandIn

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "build" / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.fail(
            "headless Chromium is needed: apt-get install chromium chromium-driver "
            "(scripts/test installs them when it can)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,2400",
        f"--user-data-dir={tmp_path / 'chromium'}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def _traffic(server: Any) -> None:
    subprocess.run(
        [CTXBUDGET, "memory", "add", "Deploys happen on Tuesdays after standup"]
        + ["--config", str(server.config_path)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    client = sdk(base_url=server.base_url, api_key="sk-x")
    client.chat.completions.create(**openclaw_request(version="9.x", stream=False, model="gpt-4o"))
    stream = openclaw_request(version="4.x", stream=True, model="my-local-llama")
    for _ in client.chat.completions.create(**stream):
        pass
    turn = openclaw_request(version="9.x", stream=False, model="gpt-4o")
    turn["messages"].append({"role": "user", "content": "when do we deploy?"})
    client.chat.completions.create(**turn)


OVERLAPS = """
const out = [];
for (const chart of document.querySelectorAll("svg[id$='-chart']")) {
  const texts = [...chart.querySelectorAll("text")].map(e => [e, e.getBoundingClientRect()]);
  const bars = [...chart.querySelectorAll("rect")].map(e => [e, e.getBoundingClientRect()]);
  const hit = (a, b) => a.left < b.right - 0.5 && b.left < a.right - 0.5 &&
                        a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5;
  texts.forEach(([t, a], i) => {
    for (const [r, b] of bars) if (b.width > 0 && hit(a, b))
      out.push(`${chart.id}: "${t.textContent}" over a bar`);
    for (const [u, b] of texts.slice(i + 1)) if (hit(a, b))
      out.push(`${chart.id}: "${t.textContent}" over "${u.textContent}"`);
  });
}
return out;
"""


def _at(report: dict[str, Any], path: str) -> Any:
    """The JSON value at a page figure's path (`recent.<id>.x` looks the request up by id,
    `sessions.<i>.x` takes the list's i-th)."""
    node: Any = report
    parts = path.split(".")
    if parts[0] == "recent":
        node = {r["id"]: r for r in report["recent"]}
        node, parts = node[parts[1]], parts[2:]
    for part in parts:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


@pytest.mark.browser
def test_report_page_in_a_real_browser_agrees_with_the_json_and_the_command(
    tmp_path: Path, standin: StandIn, browser: webdriver.Chrome
) -> None:
    with serve(tmp_path, base_config(tmp_path, standin.base_url)) as server:
        _traffic(server)
        root = server.base_url.removesuffix("/v1")
        report = httpx.get(f"{root}/context/budget", timeout=30).json()
        text = httpx.get(f"{root}/context/budget?format=text", timeout=30).text
        command = sdk(base_url=server.base_url, api_key="sk-x").chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "/context budget"}]
        )
        browser.get(f"{root}/context/budget")
        title = browser.title
        first_card = browser.find_element(By.CSS_SELECTOR, "#totals .card").text
        status = browser.find_element(By.ID, "status").text
        figures = {
            e.get_attribute("data-figure"): (e.get_attribute("data-value"), e.text)
            for e in browser.find_elements(By.CSS_SELECTOR, "[data-figure]")
        }
        bars = browser.find_elements(By.CSS_SELECTOR, "#kinds-chart rect")
        bar_widths = [float(b.get_attribute("width") or 0) for b in bars]
        line = browser.find_element(By.CSS_SELECTOR, "#over-time polyline")
        rows = browser.find_elements(By.CSS_SELECTOR, "#requests tr[data-request]")
        requests_text = browser.find_element(By.ID, "requests").text
        memory_text = browser.find_element(By.ID, "memory").text
        overlaps = browser.execute_script(OVERLAPS)
        head, cards = (browser.find_element(By.ID, i).rect for i in ("head", "totals"))
        y_ticks = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#over-time .y-tick")]
        x_ticks = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#over-time .x-tick")]
        saved_line = browser.find_element(By.ID, "saved-line").get_attribute("data-value")
        recommendations = browser.find_element(By.ID, "recommendations").text
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shot = SCREENSHOTS / "report-page.png"
        assert browser.save_screenshot(str(shot))
    chat_text = command.choices[0].message.content or ""

    assert title.startswith("ctxbudget") and status == "ON"
    totals = report["totals"]
    assert totals["requests"] == 3 and totals["savedChars"] > 10_000
    # the page, figure for figure, against the JSON report
    assert len(figures) > 30
    for path, (value, shown) in figures.items():
        expected = _at(report, str(path))
        if isinstance(expected, float):
            assert float(value or "nan") == pytest.approx(expected), path
        else:
            assert value == ("" if expected is None else str(expected)), path
        if isinstance(expected, int) and not isinstance(expected, bool):
            assert shown == f"{expected:,}", path
    assert figures["totals.savedUsd"][1] == f"${totals['savedUsd']:,.6f}"
    # money first, net of cache effects: the headline card, the text's and the command's
    # first line (issue 23); the gross figures after, named as such
    net = totals["money"]["savedUsd"]
    assert figures["totals.money.savedUsd"][1] == money(net)
    assert first_card.startswith("Saved, net of cache effects\n" + money(net))
    for said in (text, chat_text):
        assert said.startswith(f"📉 ctxbudget saved {money(net)} net of cache effects")
        gross = (
            f"Gross, before cache effects: {totals['savedChars']:,} chars removed "
            f"(~{totals['savedTokens']:,} tokens"
        )
        assert gross in said
        assert f"= ${totals['savedUsd']:,.6f} at the full input price" in said
    assert f"Report page with plots: {root}/context/budget" in text
    assert f"the page: {root}/context/budget" in chat_text
    # what a person sees: plots drawn, every request with its clamps, memory choices
    assert len(bars) == 2 * len(totals["byKind"]) and all(w >= 0 for w in bar_widths)
    assert max(bar_widths) > 100
    assert len((line.get_attribute("points") or "").split()) == 3
    assert [r.get_attribute("data-request") for r in rows] == [r["id"] for r in report["recent"]]
    assert "AGENTS.md" in requests_text and "web_fetch" in requests_text and "→" in requests_text
    memory = report["recent"][0]["memory"]
    assert memory["injected"] == 1 and memory["applied"] in memory_text
    assert memory["reason"] in memory_text
    assert shot.stat().st_size > 20_000
    # the charts' labels and values stand clear of every bar and of each other (a session's
    # name used to run into its bars); and with 3 requests analyze has too little to go on
    assert overlaps == [], overlaps
    # the header stands apart from the cards; the chart is in money, the headline's, with
    # its time axis labelled once per tick (issue 36: tokens, and one time printed twice)
    assert cards["y"] - (head["y"] + head["height"]) >= 16, (head, cards)
    assert y_ticks and all(t.lstrip(MINUS).startswith("$") for t in y_ticks), y_ticks
    assert x_ticks and len(set(x_ticks)) == len(x_ticks), x_ticks
    assert float(saved_line or "nan") == pytest.approx(net)
    assert recommendations.startswith("None yet: not enough data")


@pytest.mark.browser
@pytest.mark.parametrize("days", [True, False], ids=["two-days", "first-hour"])
def test_the_holdout_card_and_both_arms_over_time_in_a_real_browser(
    tmp_path: Path, standin: StandIn, browser: webdriver.Chrome, days: bool
) -> None:
    """60 recorded-agent conversations, half held out (`tests/e2e/conversations.py`), spread
    over two days of the server's clock, or all in the first hour after the holdout was
    turned on: the page's holdout card says the measured saving and both arms, and its chart
    draws both arms' cost per request over time (in the first hour, one point each: it once
    drew a line of one point, which a browser does not show)."""
    clock = ClockFile(tmp_path / "clock")
    if not days:  # the server's clock at the start of an hour: the run stays in it
        clock.advance(3600 - time.time() % 3600)
    config = standin_config(tmp_path, standin)
    config["agents"]["defaults"]["contextBudget"]["holdout"] = 0.5
    with serve(tmp_path, config, clock=clock.path) as server:
        if days:  # 30 minutes between conversations, the recordings' idle gaps in them
            sent = replay([server], standin, clock.advance, between=1800.0)
        else:  # ~20 minutes in all
            quick = Schedule(burst=1.0, gaps=(10.0,))
            sent = replay([server], standin, clock.advance, between=2.0, schedule=quick)
        report = settled(server, len(sent))
        browser.get(f"{server.root}/context/budget")
        card = browser.find_element(By.ID, "holdout").text
        figures = {
            e.get_attribute("data-figure"): e.get_attribute("data-value")
            for e in browser.find_elements(By.CSS_SELECTOR, "#holdout [data-figure]")
        }
        chart = browser.find_element(By.ID, "holdout-over-time")
        lines = {arm: browser.find_element(By.ID, f"arm-{arm}") for arm in ("budget", "holdout")}
        points = {arm: (line.get_attribute("points") or "").split() for arm, line in lines.items()}
        drawn = {arm: line.rect for arm, line in lines.items()}
        marks = {
            arm: [m.rect for m in chart.find_elements(By.CSS_SELECTOR, f".point-{arm}")]
            for arm in ("budget", "holdout")
        }
        browser.execute_script(
            "arguments[0].scrollIntoView()", browser.find_element(By.ID, "holdout")
        )
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shot = SCREENSHOTS / f"report-page-holdout-{'days' if days else 'hour'}.png"
        assert browser.save_screenshot(str(shot))
        chart_text = chart.text

    found = report["holdout"]
    saving, arms = found["saving"], found["arms"]
    assert saving["enough"] is True
    assert f"{saving['pct']:g}% ({saving['low']:g}–{saving['high']:g}%)" in card
    assert figures["holdout.saving.pct"] == str(saving["pct"])
    for arm in ("budget", "holdout"):
        assert figures[f"holdout.arms.{arm}.conversations"] == str(arms[arm]["conversations"])
        assert f"{arms[arm]['requests']:,} requests" in card
    assert "cost per request by arm" in chart_text
    # both arms, drawn: a visible mark for each bucket the arm has (a line of one point
    # shows nothing); over two days, lines across the chart
    series = found["series"]
    for arm in ("budget", "holdout"):
        buckets = sum(p[arm] is not None for p in series)
        assert buckets >= (10 if days else 1), series
        assert len(points[arm]) == len(marks[arm]) == buckets, (points[arm], marks[arm])
        assert all(m["width"] > 2 and m["height"] > 2 for m in marks[arm]), marks[arm]
        if days:
            assert drawn[arm]["width"] > 400 and drawn[arm]["height"] > 20, drawn[arm]
