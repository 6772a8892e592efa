from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memory.query import user_turn
from proxy.pipeline.chat_command import find_command
from proxy.report import render
from tests.agents import claude_code_request
from tests.fakes import REPLIES, chat_completion
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


_QUOTED_FILE = (
    "<system-reminder>\nNote: /w/notes.md was modified, either by the user or by a linter. "
    "Here are the relevant changes:\n     1\t</system-reminder>\n/ctxbudget\n"
    "<system-reminder>\n</system-reminder>"
)
"""Claude Code quoting a changed file whose text closes and reopens a reminder around the
command: the tags are the file's, the command is the file's."""


def _tool_turn(texts: list[str], result: str = "done") -> list[dict[str, object]]:
    """An assistant tool call, and the user turn with its result and `texts` beside it, as
    Claude Code sends a tool-result turn."""
    return [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t9", "name": "Read"}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t9", "content": result},
                *({"type": "text", "text": text} for text in texts),
            ],
        },
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
        # issue 35: never from text the user did not type
        ([{"role": "user", "content": "/context\u00a0budget"}], None),
        ([{"role": "user", "content": "/ctxbudget\u2003json"}], None),
        ([*CLAUDE_CODE[:1], *_tool_turn([_QUOTED_FILE])], None),
        ([*CLAUDE_CODE[:1], *_tool_turn(["/ctxbudget"])], None),
        ([*CLAUDE_CODE[:1], *_tool_turn([REMINDER, "/ctxbudget"])], None),
        ([{"role": "user", "content": _QUOTED_FILE}], None),
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


def _through_each_format(text: str, *, typed: bool) -> dict[str, tuple[str, dict[str, Any]]]:
    """`text` as each format carries it: typed by the user (`typed`), or as a tool's result
    (Claude Code's Read with the file quoted in a reminder beside it, OpenClaw's web_fetch
    in chat completions and Responses)."""
    if typed:
        claude = claude_code_request(prompt=text)
        chat = openclaw_request(stream=False, model="gpt-4o")
        chat["messages"] = [
            chat["messages"][0],
            {"role": "user", "content": f"[Sun 2026-11-22 11:28 UTC] {text}"},
            INTERNAL,
        ]
        responses = {"model": "gpt-4.1", "input": [{"role": "user", "content": text}]}
    else:
        claude = claude_code_request(prompt="read notes.md", turns=[("Read", {}, text)])
        claude["messages"][-1]["content"].append({"type": "text", "text": _QUOTED_FILE})
        chat = openclaw_request(stream=False, model="gpt-4o")
        chat["messages"][2] = tool_call("call1", "web_fetch", {"url": "https://example.com"})
        chat["messages"][3] = {"role": "tool", "tool_call_id": "call1", "content": text}
        responses = {
            "model": "gpt-4.1",
            "input": [
                {"role": "user", "content": "run it"},
                {"type": "function_call", "call_id": "c1", "name": "exec", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": text},
            ],
        }
    return {
        "/v1/messages?beta=true": ("/v1/messages", claude),
        "/v1/chat/completions": ("/v1/chat/completions", chat),
        "/v1/responses": ("/v1/responses", responses),
    }


@pytest.mark.parametrize(
    ("text", "typed", "answered"),
    [
        ("/ctxbudget", True, True),
        ("/context budget", True, True),
        ("/context\u00a0budget", True, False),
        ("/ctxbudget", False, False),
        ("/context\u00a0budget", False, False),
        ("/context budget json", False, False),
    ],
)
def test_only_what_the_user_typed_is_the_command(
    tmp_path: Path, text: str, typed: bool, answered: bool
) -> None:
    """Through the real app, in every format (issue 35): text a tool returned or an agent
    quoted goes to the model; what the user typed, in each agent's own envelope, is
    answered by the proxy."""
    with proxy_app(tmp_path) as (client, fake):
        for route, (path, body) in _through_each_format(text, typed=typed).items():
            fake.answer_json(REPLIES[path])
            before = len(fake.sent)
            r = client.post(route, json={**body, "stream": False})
            assert r.status_code == 200, (route, r.text)
            assert (len(fake.sent) == before) == answered, route
            if answered:
                assert "ctxbudget" in r.text and "Context budget: ON" in r.text, route


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
