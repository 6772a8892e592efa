"""Hostile or odd input gets a 4xx that says what to fix, never a 500 (issue 10, item 7)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import chat_completion
from tests.inproc import config_for, proxy_app
from tests.openclaw import (
    memory_get_result,
    openclaw_request,
    tool_call,
    web_fetch_result,
)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model":"m","messages":[{"role":"user","content":' + b"[" * 3000 + b"]" * 3000 + b"}]}",
        b'{"model":"m","x":' + b"[" * 100_000 + b"]" * 100_000 + b',"messages":[]}',
    ],
    ids=["in-messages", "in-another-field"],
)
def test_json_nested_too_deeply_is_a_400_naming_the_limit(tmp_path: Path, raw: bytes) -> None:
    with proxy_app(tmp_path) as (client, fake):
        r = client.post("/v1/chat/completions", content=raw)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        "request body nests JSON too deeply (the parsers stop at about 1,000 levels): "
        "send flatter JSON"
    )
    assert fake.sent == []


def test_a_deep_array_for_a_body_is_named_as_not_an_object(tmp_path: Path) -> None:
    with proxy_app(tmp_path) as (client, _):
        r = client.post("/v1/chat/completions", content=b"[" * 100_000 + b"]" * 100_000)
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith("request body must be a JSON object, got list")


def test_non_ascii_credentials_are_refused_not_crashed_on(tmp_path: Path) -> None:
    env = {"CTXBUDGET_PROXY_KEYS": "alice=ka-1", "CTXBUDGET_ADMIN_KEY": "adm-1"}
    bearer = [(b"authorization", "Bearer k\u00e9y".encode())]
    basic = "Basic " + base64.b64encode("u:p\u00e9".encode()).decode()
    with proxy_app(tmp_path, env=env) as (client, _):
        chat = client.post("/v1/chat/completions", content=b"{}", headers=bearer)
        page = client.get(
            "/context/budget", headers={"accept": "text/html", "authorization": basic}
        )
        memories = client.get("/v1/memories", headers=bearer)
    assert (chat.status_code, page.status_code, memories.status_code) == (401, 401, 401)


@pytest.mark.parametrize("memory_id", ["\u00b2", "1" * 30, "-1", "1e3"])
def test_memory_ids_that_are_not_plain_numbers_are_a_400(tmp_path: Path, memory_id: str) -> None:
    with proxy_app(tmp_path) as (client, _):
        r = client.delete(f"/v1/memories/{memory_id}")
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith("memory id must be a number, got ")


def test_the_admin_key_is_taken_only_as_a_bearer_token(tmp_path: Path) -> None:
    env = {"CTXBUDGET_ADMIN_KEY": "adm-1"}
    with proxy_app(tmp_path, env=env) as (client, _):
        token = client.get("/v1/memories", headers={"authorization": "Token adm-1"})
        bearer = client.get("/v1/memories", headers={"authorization": "Bearer adm-1"})
    assert (token.status_code, bearer.status_code) == (401, 200)


def test_too_many_or_too_large_headers_are_a_431(tmp_path: Path) -> None:
    with proxy_app(tmp_path) as (client, fake):
        big = client.post("/v1/chat/completions", content=b"{}", headers={"x-big": "a" * 70_000})
        many = client.get("/healthz", headers={f"x-h{i}": "1" for i in range(120)})
        fine = client.get("/healthz", headers={f"x-h{i}": "1" for i in range(50)})
    assert (big.status_code, many.status_code, fine.status_code) == (431, 431, 200)
    assert "the proxy takes at most 100 headers and 65,536 bytes" in big.json()["error"]["message"]
    assert fake.sent == []


def test_credentials_in_the_upstream_url_are_never_shown() -> None:
    from proxy.urls import redact

    assert redact("https://user:sk-9@api.example/v1/x?a=1") == "https://***@api.example/v1/x?a=***"
    assert redact("http://127.0.0.1:9/v1") == "http://127.0.0.1:9/v1"


def test_the_text_report_carries_no_terminal_escapes(tmp_path: Path) -> None:
    from tests.openclaw import openclaw_request, web_fetch_result

    body = openclaw_request(stream=False)
    url = "https://x.example/\x1b]0;pwned\x07\x1b[2J"
    body["messages"][3]["content"] = web_fetch_result(url=url, content="y " * 9000)
    with proxy_app(tmp_path) as (client, _):
        client.post("/v1/chat/completions", json=body)
        text = client.get("/context/budget?format=text").text
    assert "https://x.example/" in text
    assert "\x1b" not in text and "\x07" not in text


# -- issue 24, item 9: each was a 500, which also closes the client's connection -------------


def _fail_closed(tmp_path: Path) -> dict[str, Any]:
    """The budget on, and a clamp that raises is a 500 (`failClosed`): what was a crash shows."""
    return config_for(tmp_path, agents={"defaults": {"contextBudget": {"failClosed": True}}})


def _messages_with_result(tool_use_id: Any, content: Any = "x") -> dict[str, Any]:
    call = {"type": "tool_use", "id": "t1", "name": "x", "input": {}}
    result = {"type": "tool_result", "tool_use_id": tool_use_id, "content": content}
    return {
        "model": "claude-x",
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "fetch"},
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [result]},
        ],
    }


@pytest.mark.parametrize(("tool_use_id", "kind"), [(["t1"], "list"), ({"id": "t1"}, "object")])
def test_a_tool_use_id_that_is_not_a_string_is_a_400(
    tmp_path: Path, tool_use_id: Any, kind: str
) -> None:
    with proxy_app(tmp_path) as (client, fake):
        r = client.post("/v1/messages", json=_messages_with_result(tool_use_id))
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        "'messages[2].content[0].tool_use_id' must be a string (the id of the tool_use block "
        f"it answers), got {kind}"
    )
    assert fake.sent == []


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/messages"])
def test_a_user_id_holding_json_nested_200000_deep_is_not_a_session(
    tmp_path: Path, route: str
) -> None:
    user_id = '{"session_id": ' + "[" * 200_000 + "]" * 200_000 + "}"
    body = {**_messages_with_result("t1"), "metadata": {"user_id": user_id}}
    if route == "/v1/chat/completions":
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
        body["messages"] = [{"role": "user", "content": "hi"}]
    with proxy_app(tmp_path) as (client, fake):
        fake.answer_json(chat_completion())
        r = client.post(route, json=body, headers={"x-api-key": "k"})
    assert r.status_code == 200, r.text
    assert r.headers["x-context-budget-session"].startswith("prefix:")


def test_arguments_sent_as_an_object_leave_the_rest_clamped(tmp_path: Path) -> None:
    body = openclaw_request(stream=False)
    body["messages"][2]["tool_calls"][0]["function"]["arguments"] = {"url": "https://x.example"}
    with proxy_app(tmp_path, _fail_closed(tmp_path)) as (client, fake):
        fake.answer_json(chat_completion())
        r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert int(r.headers["x-context-budget-clamped"]) >= 3
    assert fake.last.json["messages"][2] == body["messages"][2]  # forwarded as it came


@pytest.mark.parametrize("name", ["web_fetch", "memory_get"])
def test_a_lone_surrogate_in_a_tool_result_is_clamped_like_any_text(
    tmp_path: Path, name: str
) -> None:
    text = "\ud800" + "z" * 60_000
    content = {
        "web_fetch": web_fetch_result(version="9.x", content=text),
        "memory_get": memory_get_result(text=text),
    }[name]
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "run it"},
            tool_call("c1", name, {}),
            {"role": "tool", "tool_call_id": "c1", "content": content},
        ],
    }
    raw = json.dumps(body).encode()  # the surrogate as the escape `\ud800`
    with proxy_app(tmp_path, _fail_closed(tmp_path)) as (client, fake):
        fake.answer_json(chat_completion())
        r = client.post("/v1/chat/completions", content=raw)
    assert r.status_code == 200, r.text
    assert r.headers["x-context-budget-clamped"] == "1"
    sent = json.loads(fake.last.body or b"")["messages"][2]["content"]
    assert "\ud800" in sent and len(sent) < len(content)


_NUMBER_TEXT = [
    (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
        "messages[0].content[0].text",
    ),
    (
        "/v1/chat/completions",
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text"}]},
            ],
        },
        "messages[1].content[1].text",
    ),
    (
        "/v1/messages",
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": [{"type": "text", "text": ["x"]}]}],
        },
        "messages[0].content[0].text",
    ),
    (
        "/v1/messages",
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 5,
            "system": [{"type": "text", "text": 5}],
            "messages": [{"role": "user", "content": "hi"}],
        },
        "system[0].text",
    ),
    (
        "/v1/messages",
        _messages_with_result("t1", [{"type": "text", "text": 5}, {"type": "text", "text": "y"}]),
        "messages[2].content[0].content[0].text",
    ),
    (
        "/v1/responses",
        {
            "model": "gpt-4.1",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": {"a": 1}}]}],
        },
        "input[0].content[0].text",
    ),
]


@pytest.mark.parametrize("fail_closed", [False, True])
@pytest.mark.parametrize(("route", "body", "param"), _NUMBER_TEXT)
def test_a_text_part_whose_text_is_not_a_string_is_a_400(
    tmp_path: Path, route: str, body: dict[str, Any], param: str, fail_closed: bool
) -> None:
    """`{"type":"text","text":5}` made the chat clamp raise: the whole request went on
    unclamped, or was a 500 with `failClosed` (issue 35). Every provider refuses it with a
    400; so does the proxy, in the client's own format, before anything goes upstream."""
    config = config_for(tmp_path)
    config["agents"]["defaults"]["contextBudget"]["failClosed"] = fail_closed
    with proxy_app(tmp_path, config) as (client, fake):
        r = client.post(route, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["message"].startswith(f"'{param}' must be a string, got ")
    assert error["type"] == "invalid_request_error"
    if route == "/v1/messages":
        assert r.json()["type"] == "error"
    else:
        assert error["param"] == param
    assert fake.sent == []
