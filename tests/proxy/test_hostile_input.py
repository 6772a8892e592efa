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
