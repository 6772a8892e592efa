"""With proxy keys, each key sees only its own report; the admin key sees all (issue 10,
item 4): the JSON and text report, the page, one request's record and the chat command."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.inproc import InProcess, proxy_app
from tests.openclaw import memory_get_result, openclaw_request, web_fetch_result

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


def _events(*events: dict[str, Any]) -> list[bytes]:
    return [
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events
    ]


def test_a_key_cannot_continue_another_keys_response(tmp_path: Path) -> None:
    """With proxy keys every key reaches the upstream with the one upstream key: bob naming
    alice's response id got her stored conversation continued for him (issue 24, item 12)."""
    call = {"type": "function_call", "call_id": "call_a", "name": "memory_get", "arguments": "{}"}
    notes = memory_get_result(text="alice's private notes. " * 300, path="alice/MEMORY.md")
    result = {"type": "function_call_output", "call_id": "call_a", "output": notes}
    env = {**ENV, "OPENAI_API_KEY": "sk-ours"}
    with proxy_app(tmp_path, env=env) as (client, fake):
        # alice's two responses, one streamed, one not: both ids are hers
        fake.answer_sse(
            _events(
                {"type": "response.created", "response": {"id": "resp_A1", "output": []}},
                {"type": "response.output_item.done", "output_index": 0, "item": call},
                {"type": "response.completed", "response": {"id": "resp_A1", "output": [call]}},
            )
        )
        asked = {"model": "m", "input": "fetch it", "stream": True}
        assert client.post("/v1/responses", json=asked, headers=ALICE).status_code == 200
        fake.answer_json({"id": "resp_A2", "object": "response", "output": [call]})
        assert client.post("/v1/responses", json={"model": "m", "input": "again"}, headers=ALICE)
        sent = len(fake.sent)

        fake.answer_json({"id": "resp_B1", "object": "response", "output": []})
        for taken in ("resp_A1", "resp_A2"):
            for stream in (False, True):
                body = {"model": "m", "previous_response_id": taken, "input": [result]}
                r = client.post("/v1/responses", json={**body, "stream": stream}, headers=BOB)
                assert r.status_code == 400
                assert r.json()["error"] == {
                    "message": f"Previous response with id '{taken}' not found.",
                    "type": "invalid_request_error",
                    "param": "previous_response_id",
                    "code": "previous_response_not_found",
                }
        # a body over 1 MiB (parsed in the offload process) is refused the same way
        big = {"model": "m", "previous_response_id": "resp_A1", "input": "x" * (1 << 20)}
        r = client.post("/v1/responses", json=big, headers=BOB)
        assert r.status_code == 400 and r.json()["error"]["code"] == "previous_response_not_found"
        assert len(fake.sent) == sent  # nothing went upstream

        # an id the proxy never returned goes on; alice's call names stay hers
        body = {"model": "m", "previous_response_id": "resp_elsewhere", "input": [result]}
        assert client.post("/v1/responses", json=body, headers=BOB).status_code == 200
        # alice continues her own as before
        body = {"model": "m", "previous_response_id": "resp_A1", "input": [result]}
        mine = client.post("/v1/responses", json=body, headers=ALICE)
        assert mine.status_code == 200 and mine.headers["x-context-budget-clamped"] == "1"

        bobs = client.get("/context/budget", headers=BOB).json()
        alices = client.get("/context/budget", headers=ALICE).json()
        bobs_request = bobs["recent"][0]["id"]
        detail = client.get(f"/context/budget/requests/{bobs_request}", headers=BOB).json()
    assert bobs["totals"]["requests"] == 1 and alices["totals"]["requests"] == 3
    # alice's call names are not bob's: his result is no tool's he called
    assert detail["segments"] == []
    # his session holds his request only, never joined to hers (keyed by owner)
    assert [s["requests"] for s in bobs["sessions"]] == [1]


@pytest.mark.parametrize(
    "query", ["?format=text&section=zzz", "?format=xml", "?format=json&section=caps", "?since=x"]
)
def test_without_a_key_the_report_is_a_401_whatever_its_query(tmp_path: Path, query: str) -> None:
    # Found by the round-36 attack: `format` and `section` were checked before the key, so a
    # caller with none got a 400 about its query: the key comes first, as on every route.
    with proxy_app(tmp_path, env=ENV) as (client, _):
        anonymous = client.get(f"/context/budget{query}")
        wrong = client.get(f"/context/budget{query}", headers={"authorization": "Bearer no"})
        alice = client.get(f"/context/budget{query}", headers=ALICE)
    assert (anonymous.status_code, wrong.status_code, alice.status_code) == (401, 401, 400)
