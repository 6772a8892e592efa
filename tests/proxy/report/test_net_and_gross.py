"""Net and gross side by side (issue 36, item 8): a request whose net saving is above its
gross one must say why, where both are shown."""

from __future__ import annotations

from pathlib import Path

from proxy.demo.run import sample_requests
from tests.fakes import chat_completion
from tests.inproc import config_for, proxy_app

WHY = "Net above gross"


def test_net_above_gross_is_explained_where_both_are_shown(tmp_path: Path) -> None:
    # OpenClaw's first request of a session: nothing cached, so the net saving is the removed
    # tokens at the input price, counted as the provider counts the request it is sent
    body = {**sample_requests()[0], "stream": False}
    body.pop("stream_options")
    answer = chat_completion(model="gpt-5.5")
    answer["usage"] = {"prompt_tokens": 20_000, "completion_tokens": 20, "total_tokens": 20_020}
    config = config_for(tmp_path, memory={"inject": {"enabled": False}})
    with proxy_app(tmp_path, config) as (client, fake):
        fake.answer_json(answer)
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        report = client.get("/context/budget").json()
        text = client.get("/context/budget?format=text").text
        summary = client.get("/context/budget?format=summary").text
        page = client.get("/context/budget", headers={"accept": "text/html"}).text
    totals = report["totals"]
    assert totals["money"]["savedUsd"] > totals["savedUsd"] > 0
    for shown in (text, summary, page):
        assert WHY in shown
