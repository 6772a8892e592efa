"""The report's page (`proxy/report/page.py`) as a user reads it, through the app."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fakes import chat_completion
from tests.inproc import proxy_app

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
