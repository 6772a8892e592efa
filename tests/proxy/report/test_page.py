"""The report page (`GET /context/budget` in a browser) as a user reads it, through the app:
its savings chart, and the results it names."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from ctxbudget.proxy.report.arms import ARMS
from tests.fakes import chat_completion
from tests.inproc import config_for, proxy_app
from tests.openclaw import openclaw_request

LEFT_WHOLE = "no untrusted-content wrapper to cut inside: left whole"


def test_the_page_says_why_a_page_over_the_cap_was_left_whole(tmp_path: Path) -> None:
    # a web_fetch result without OpenClaw's <<<EXTERNAL_UNTRUSTED_CONTENT>>> wrapper: the
    # clamp cannot cut it safely, and the user must see that on the page, not only in the text
    page = {"url": "https://example.com/big", "text": "plain page text " * 1000}
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "user", "content": "read https://example.com/big"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "web_fetch", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(page)},
        ],
    }
    with proxy_app(tmp_path) as (client, fake):
        fake.answer_json(chat_completion())
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        text = client.get("/context/budget?format=text").text
        html = client.get("/context/budget", headers={"accept": "text/html"}).text
    assert LEFT_WHOLE in text  # the text report always said it
    assert LEFT_WHOLE in html
    assert "https://example.com/big" in html  # which result, as the text report names it


HOUR = 3600.0


def _chart(html: str) -> str:
    found = re.search(r"<svg id='over-time-chart'.*?</svg>", html, re.S)
    assert found, "no savings-over-time chart"
    return found.group()


def _texts(svg: str, cls: str) -> list[str]:
    return re.findall(rf"<text [^>]*class='{cls}'[^>]*>([^<]*)</text>", svg)


def _traffic(tmp_path: Path, times: list[float]) -> tuple[str, dict[str, Any]]:
    """One OpenClaw request at each of `times` (the app's clock); the page and the JSON."""
    now = [times[0]]
    with proxy_app(tmp_path, clock=lambda: now[0]) as (client, _):
        for at in times:
            now[0] = at
            body = openclaw_request(stream=False, model="gpt-4o")
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        page = client.get("/context/budget", headers={"accept": "text/html"}).text
        report = client.get("/context/budget").json()
    return page, report


def test_the_chart_is_net_money_saved_the_headline_s_figures(tmp_path: Path) -> None:
    start = time.time() - 3 * HOUR
    page, report = _traffic(tmp_path, [start, start + 60, start + 120])
    chart = _chart(page)
    net = report["totals"]["money"]["savedUsd"]
    assert net is not None and net != 0
    line = re.search(r"<polyline id='saved-line'[^>]*data-value='([^']*)'", chart)
    assert line and float(line.group(1)) == pytest.approx(net)  # ends where the headline is
    assert sum(r["netSavedUsd"] for r in report["recent"]) == pytest.approx(net)
    ticks = _texts(chart, "y-tick")
    assert len(ticks) >= 2 and all(t.lstrip("\u2212").startswith("$") for t in ticks), ticks
    assert "tokens" not in re.sub(r"<[^>]+>", "", page.split("over-time", 1)[1].split("</h2>")[0])


@pytest.mark.parametrize(
    ("span", "label"),
    [(20.0, r"\d\d:\d\d:\d\d"), (5 * HOUR, r"\d\d:\d\d"), (6 * 24 * HOUR, r"[A-Z][a-z]{2} \d\d")],
)
def test_the_time_axis_has_readable_distinct_ticks(tmp_path: Path, span: float, label: str) -> None:
    # noon UTC a week ago, on the second: where the ticks fall must not hang on the wall
    # clock's time of day (a start at a random fraction of a second once gave too few)
    start = (time.time() // (24 * HOUR) - 7) * 24 * HOUR + 12 * HOUR
    page, _ = _traffic(tmp_path, [start, start + span / 3, start + span])
    ticks = _texts(_chart(page), "x-tick")
    assert 3 <= len(ticks) <= 7, ticks
    assert len(set(ticks)) == len(ticks), ticks  # no label twice
    assert all(
        re.fullmatch(label, t) or re.fullmatch(r"[A-Z][a-z]{2} \d\d \d\d:\d\d", t) for t in ticks
    ), ticks
    xs = [float(x) for x in re.findall(r"<text x='([\d.]+)'[^>]*class='x-tick'", _chart(page))]
    assert all(b - a >= 90 for a, b in zip(xs, xs[1:], strict=False)), xs  # room for a label


def test_the_header_stands_apart_from_the_cards(tmp_path: Path) -> None:
    page, _ = _traffic(tmp_path, [time.time() - 60, time.time()])
    assert re.search(r"<header id='head'>.*?</header><div class='cards' id='totals'>", page, re.S)
    css = re.search(r"header \{[^}]*margin-bottom:\s*(\d+)px", page)
    assert css and int(css.group(1)) >= 16


def test_the_holdout_chart_shows_both_arms_in_its_first_hour(tmp_path: Path) -> None:
    # right after the holdout is turned on every conversation began in the same hour: one
    # point an arm, which a line alone does not draw
    budget = {"enabled": True, "holdout": 0.5}
    config = config_for(tmp_path, agents={"defaults": {"contextBudget": budget}})
    with proxy_app(tmp_path, config) as (client, fake):
        fake.answer_json(chat_completion(model="gpt-4o"))
        for n in range(12):
            body = openclaw_request(stream=False, model="gpt-4o")
            body["messages"][1]["content"] = f"[conversation {n}] what changed?"
            r = client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
        found = client.get("/context/budget").json()["holdout"]
        html = client.get("/context/budget?format=html").text
    assert len(found["series"]) == 1
    assert all(found["arms"][arm]["conversations"] > 0 for arm in ARMS), found["arms"]
    chart = html[html.index("id='holdout-over-time'") :]
    chart = chart[: chart.index("</svg>")]
    for arm in ARMS:
        marks = re.findall(rf"<circle class='point-{arm}' cx='([\d.]+)' cy='([\d.]+)'", chart)
        assert len(marks) == 1, chart
        (line,) = re.findall(rf"id='arm-{arm}' points='([^']*)'", chart)
        assert line.split() == [",".join(marks[0])]
        assert float(marks[0][0]) > 300  # mid-chart, not against its left edge
