"""Hostile or odd input gets a 4xx that says what to fix, never a 500 (issue 10, item 7)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from tests.inproc import proxy_app


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
