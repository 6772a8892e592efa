from __future__ import annotations

import json
from pathlib import Path

import pytest

from memory.query import user_turn
from proxy.pipeline.chat_command import find_command
from proxy.report import render
from tests.fakes import chat_completion
from tests.inproc import InProcess, proxy_app, state_of
from tests.openclaw import openclaw_request, tool_call

INTERNAL = {
    "role": "user",
    "content": [
        {
            "type": "text",
            "text": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nx\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>",
        }
    ],
}


REMINDER = (
    "<system-reminder>\nThe user's message starts with the slash command /ctxbudget, but no "
    "command with that name is available in this session, so it did not run.\n</system-reminder>"
)
CLAUDE_CODE = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": REMINDER},
            {
                "type": "text",
                "text": "<system-reminder>\nContents of /w/CLAUDE.md (x):\n\nRules\n"
                "</system-reminder>",
            },
            {"type": "text", "text": "/ctxbudget"},
        ],
    },
    {"role": "system", "content": [{"type": "text", "text": "# Environment\n - cwd: /w"}]},
]


@pytest.mark.parametrize(
    ("messages", "mode"),
    [
        ([{"role": "user", "content": "/context budget"}], "summary"),
        ([{"role": "user", "content": "  /context   budget  json "}], "json"),
        ([{"role": "user", "content": [{"type": "text", "text": "/context budget"}]}], "summary"),
        (
            [
                {
                    "role": "user",
                    "content": "[Sun 2026-11-22 11:28 UTC] /context budget\n\n"
                    "Runtime: agent=main | host=vm",
                },
                INTERNAL,
            ],
            "summary",
        ),
        ([{"role": "user", "content": "/context budgets"}], None),
        ([{"role": "user", "content": "what does /context budget do?"}], None),
        ([{"role": "user", "content": "/context budget\nand more"}], None),
        (
            [{"role": "user", "content": "/context budget"}, {"role": "assistant", "content": "x"}],
            None,
        ),
        ([{"role": "user", "content": "/ctxbudget"}], "summary"),
        ([{"role": "user", "content": "/ctxbudget json"}], "json"),
        ([{"role": "user", "content": "/context budget full"}], "full"),
        ([{"role": "user", "content": "/ctxbudget FULL"}], None),
        ([{"role": "user", "content": "/ctxbudget now"}], None),
        ([], None),
        # Claude Code (issue 21): reminders beside the user's text, its environment after it
        (CLAUDE_CODE, "summary"),
        ([CLAUDE_CODE[0]], "summary"),
        ([{"role": "user", "content": REMINDER + "\n/ctxbudget json"}], "json"),
        ([{"role": "user", "content": "/ctxbudget " + REMINDER}], "summary"),
        (
            [*CLAUDE_CODE, {"role": "user", "content": [{"type": "text", "text": REMINDER}]}],
            "summary",
        ),
        ([{"role": "user", "content": REMINDER}], None),
        (
            [
                *CLAUDE_CODE,
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Bash"}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
            ],
            None,
        ),
    ],
)
def test_command_is_found_only_in_the_latest_real_user_text(
    messages: list[dict[str, object]], mode: str | None
) -> None:
    assert find_command(user_turn(messages)) == mode


def _ask(client: InProcess, text: str) -> str:
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": text}], "stream": False}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def test_the_plain_command_is_chat_sized_and_full_and_json_give_the_rest(tmp_path: Path) -> None:
    """After 36 requests the whole text report is tens of thousands of chars (issue 23):
    `/context budget` answers a summary of at most ~25 lines, net money first."""
    with proxy_app(tmp_path) as (client, fake):
        fake.answer_json(chat_completion(model="gpt-4o"))
        for i in range(36):
            body = openclaw_request(stream=False, model="gpt-4o")
            body["messages"][2] = tool_call(
                "callwebfetch34529", "web_fetch", {"url": f"https://example.com/{i}"}
            )
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        state_of(client).reports.flush()
        summary = _ask(client, "/context budget")
        full = _ask(client, "/ctxbudget full")
        as_json = json.loads(_ask(client, "/context budget json"))
        over_http = client.get("/context/budget?format=summary").text
        report = client.get("/context/budget").json()
    lines = summary.splitlines()
    assert len(lines) <= 25 and len(summary) < 3_000, summary
    assert len(full) > 10 * len(summary)
    money = report["totals"]["money"]
    assert lines[0] == (
        f"📉 ctxbudget saved {render.money(money['savedUsd'])} net of cache effects over "
        f"1 session (billed {render.money(money['costUsd'])}; "
        f"{render.money(money['withoutCtxbudgetUsd'])} without ctxbudget)"
    )
    assert lines[1].startswith("Context budget: ON")
    assert "Caps: bootstrap files 8,000 per file" in summary
    assert "Gross, before cache effects: " in summary  # after the net figure, and named
    assert "- bootstrap " in summary and "AGENTS.md: " in summary and "(36×)" in summary
    assert lines[-1].startswith("More: /context budget full")
    assert full.startswith(lines[0]) and "Recent requests:" in full
    assert as_json["totals"]["requests"] == 36
    assert over_http.splitlines()[1:] == lines[1:]  # the HTTP summary is the command's


def test_full_gives_one_section_at_a_time_and_the_plain_command_names_them(
    tmp_path: Path,
) -> None:
    """Issue 36, item 10: `full` was 220 lines in a chat; a user asks for one section."""
    with proxy_app(tmp_path) as (client, _):
        client.post("/v1/memories", json={"text": "Deploys happen on Tuesdays"})
        for _ in range(3):
            body = openclaw_request(stream=False, model="gpt-4o")
            body["messages"].append({"role": "user", "content": "when do deploys happen?"})
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        summary = _ask(client, "/context budget")
        full = _ask(client, "/ctxbudget full")
        parts = {
            name: _ask(client, f"/context budget full {name}") for name in render.TEXT_SECTIONS
        }
        over_http = client.get("/context/budget?format=text&section=caps").text
        bad = client.get("/context/budget?format=text&section=everything")
        unknown = _ask(client, "/ctxbudget full everything")
        whole_http = client.get("/context/budget?format=text").text
    assert set(render.TEXT_SECTIONS) == {"caps", "money", "kinds", "requests", "memory"}
    assert "full caps, money, kinds, requests, memory" in summary.splitlines()[-1]
    headline = full.splitlines()[0]
    for name, text in parts.items():
        assert text.startswith(headline + "\n"), name  # money first in every section
        assert len(text) < len(full) * (0.8 if name == "requests" else 0.5), name
    assert "Effective caps (UTF-16 chars):" in parts["caps"] and "Recent" not in parts["caps"]
    assert "Sessions (newest first):" in parts["money"]
    assert "By kind:" in parts["kinds"] and "Effective caps" not in parts["kinds"]
    assert "Recent requests:" in parts["requests"] and "By kind:" not in parts["requests"]
    assert "memories: lean" in parts["memory"] and "web_fetch" not in parts["memory"]
    assert over_http.splitlines()[1:-1] == parts["caps"].splitlines()[1:-1]
    assert bad.status_code == 400 and bad.json()["error"] == {
        "message": "section must be one of caps, money, kinds, requests, memory; got "
        "'everything' (without it, format=text is the whole report)",
        "type": "invalid_request_error",
        "param": "section",
        "code": "invalid_request",
    }
    assert unknown.startswith("ctxbudget: the report has no section 'everything'")
    assert whole_http.rstrip("\n") == full.rstrip("\n")  # plain `full`: the whole text
