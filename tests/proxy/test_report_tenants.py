"""With proxy keys, each key sees only its own report; the admin key sees all (issue 10,
item 4): the JSON and text report, the page, one request's record and the chat command."""

from __future__ import annotations

import base64
from pathlib import Path

import orjson

from tests.inproc import InProcess, proxy_app
from tests.openclaw import openclaw_request, web_fetch_result

ENV = {"CTXBUDGET_PROXY_KEYS": "alice=ka-1,bob=kb-2", "CTXBUDGET_ADMIN_KEY": "adm-1"}
ALICE, BOB = {"authorization": "Bearer ka-1"}, {"authorization": "Bearer kb-2"}
ADMIN = {"authorization": "Bearer adm-1"}
SECRET_URL = "https://intranet.example/doc?token=alice-secret-123"


def _alices_request(client: InProcess) -> str:
    body = openclaw_request(stream=False)
    body["messages"][3]["content"] = web_fetch_result(url=SECRET_URL, content="x " * 9000)
    r = client.post("/v1/chat/completions", json=body, headers=ALICE)
    assert r.status_code == 200
    return r.headers["x-context-budget-request-id"]


def _basic(key: str) -> dict[str, str]:
    return {
        "accept": "text/html",
        "authorization": "Basic " + base64.b64encode(f"me:{key}".encode()).decode(),
    }


def test_a_key_sees_only_its_own_requests_and_totals(tmp_path: Path) -> None:
    with proxy_app(tmp_path, env=ENV) as (client, _):
        _alices_request(client)
        client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            headers=BOB,
        )
        mine = client.get("/context/budget", headers=ALICE).json()
        theirs = client.get("/context/budget", headers=BOB).json()
        everyone = client.get("/context/budget", headers=ADMIN).json()
        assert (mine["totals"]["requests"], theirs["totals"]["requests"]) == (1, 1)
        assert everyone["totals"]["requests"] == 2
        assert mine["totals"]["clamped"] == 4 and theirs["totals"]["clamped"] == 0
        assert SECRET_URL in orjson.dumps(mine).decode()
        assert [r["owner"] for r in theirs["recent"]] == ["bob"]
        for surface in (
            client.get("/context/budget", headers=BOB).text,
            client.get("/context/budget?format=text", headers=BOB).text,
            client.get("/context/budget", headers=_basic("kb-2")).text,
        ):
            assert "alice-secret-123" not in surface
            assert "/home/agent/.openclaw/workspace" not in surface
        assert "alice-secret-123" in client.get("/context/budget", headers=_basic("ka-1")).text
        assert "alice-secret-123" in client.get("/context/budget", headers=_basic("adm-1")).text


def test_one_requests_record_is_its_owners(tmp_path: Path) -> None:
    with proxy_app(tmp_path, env=ENV) as (client, _):
        request_id = _alices_request(client)
        path = f"/context/budget/requests/{request_id}"
        assert client.get(path, headers=ALICE).json()["owner"] == "alice"
        assert client.get(path, headers=ADMIN).status_code == 200
        other = client.get(path, headers=BOB)
        assert other.status_code == 404  # not 403: bob learns nothing about it
        assert client.get(path).status_code == 401


def test_the_chat_command_reports_the_callers_own_requests(tmp_path: Path) -> None:
    with proxy_app(tmp_path, env=ENV) as (client, fake):
        _alices_request(client)
        command = {"model": "m", "messages": [{"role": "user", "content": "/ctxbudget json"}]}
        bobs = client.post("/v1/chat/completions", json=command, headers=BOB)
        alices = client.post("/v1/chat/completions", json=command, headers=ALICE)
    bob_report = orjson.loads(bobs.json()["choices"][0]["message"]["content"])
    alice_report = orjson.loads(alices.json()["choices"][0]["message"]["content"])
    assert bob_report["totals"]["requests"] == 0 and bob_report["recent"] == []
    assert alice_report["totals"]["requests"] == 1
    assert len(fake.sent) == 1


def test_without_keys_the_one_owner_sees_everything(tmp_path: Path) -> None:
    with proxy_app(tmp_path) as (client, _):
        client.post("/v1/chat/completions", json=openclaw_request(stream=False))
        report = client.get("/context/budget").json()
    assert report["totals"]["requests"] == 1
    assert report["recent"][0]["owner"] == "default"
