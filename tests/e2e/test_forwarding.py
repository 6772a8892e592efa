"""The real server (`ctxbudget serve`) in front of the stand-in upstream, driven by the SDK."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.checks import check_received
from tests.e2e.server import base_config, free_port, sdk, serve, standin_config
from tests.openclaw import load_fixtures
from tests.standin import StandIn

REQUEST_ID = "x-context-budget-request-id"

FIXTURES = load_fixtures()
CAPS = {"bootstrap": 8000, "memory": 2500, "web_fetch": 8000}  # defaults of contextBudget


def _client(server_url: str, **kw: Any) -> openai.OpenAI:
    return sdk(base_url=server_url, api_key=kw.pop("api_key", "sk-client"), **kw)


@pytest.mark.skipif(not FIXTURES, reason="captured OpenClaw requests are not present")
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_fixtures_reach_upstream_within_caps(
    tmp_path: Path, standin: StandIn, stream: bool
) -> None:
    with serve(tmp_path, base_config(tmp_path, standin.base_url)) as server:
        client = _client(server.base_url)
        for name, body in FIXTURES:
            standin.reset()
            body = {**body, "stream": stream}
            if not stream:
                body.pop("stream_options", None)
            raw = client.chat.completions.with_raw_response.create(**body)
            if stream:
                chunks = list(raw.parse())
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            else:
                text = raw.parse().choices[0].message.content or ""
            assert text.startswith("standin"), name
            assert len(standin.received) == 1, name
            clamped = check_received(body, standin.received[0].json, **CAPS)
            assert clamped["bootstrap"] >= 1, name  # the captured AGENTS.md is ~19k chars
            assert raw.headers["x-context-budget-enabled"] == "true"
            assert int(raw.headers["x-context-budget-clamped"]) == sum(clamped.values()), name
            assert int(raw.headers["x-context-budget-saved-chars"]) > 0
            assert raw.headers["x-context-budget-memories"] == "0"
            detail = httpx.get(
                f"{server.root}/context/budget/requests/"
                f"{raw.headers['x-context-budget-request-id']}"
            ).json()
            assert detail["clamped"] == sum(clamped.values())
            assert {s["kind"] for s in detail["segments"] if s["action"] == "clamped"} == {
                k for k, v in clamped.items() if v
            }


def test_json_and_stream_through_the_sdk(tmp_path: Path, standin: StandIn) -> None:
    with serve(tmp_path, base_config(tmp_path, standin.base_url)) as server:
        client = _client(server.base_url)
        reply = client.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "hello"}]
        )
        assert reply.choices[0].message.content == "standin: received 1 messages"
        chunks = list(
            client.chat.completions.create(
                model="gpt-test",
                messages=[{"role": "user", "content": "hello"}],
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "standin: received 1 messages"
        assert chunks[-1].usage is not None
        assert [r.path for r in standin.received] == ["/v1/chat/completions"] * 2


def test_stream_is_relayed_as_it_arrives(tmp_path: Path, standin: StandIn) -> None:
    with serve(tmp_path, base_config(tmp_path, standin.base_url)) as server:
        body = {
            "model": "gpt-test",
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
            "x_standin": {"chunks": 5, "chunk_delay": 0.3},
        }
        arrivals = []
        start = time.monotonic()
        with httpx.stream("POST", f"{server.base_url}/chat/completions", json=body) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            for line in r.iter_lines():
                if line.startswith("data: "):
                    arrivals.append(time.monotonic() - start)
        assert len(arrivals) >= 6
        # chunks arrive spread over ~1.5 s, not all at once at the end
        assert arrivals[0] < 0.5 < arrivals[-1] - arrivals[0]


def test_unknown_fields_and_headers_pass_through(tmp_path: Path, standin: StandIn) -> None:
    with serve(tmp_path, base_config(tmp_path, standin.base_url)) as server:
        body = {
            "model": "gpt-test",
            "messages": [{"role": "user", "content": "hi"}],
            "vendor_extension": {"nested": [1, 2.5, None, "ü"]},
        }
        r = httpx.post(
            f"{server.base_url}/chat/completions",
            content=json.dumps(body),
            headers={"content-type": "application/json", "x-trace": "t-1"},
        )
        assert r.status_code == 200
        got = standin.received[0]
        assert got.json == body
        assert got.headers["x-trace"] == "t-1"
        # the stand-in (uvicorn) sends its own server and date: the client gets one of each
        assert len(r.headers.get_list("server")) == len(r.headers.get_list("date")) == 1
        # and the server logs one line for the request, without its content
        line = next(x for x in server.output().splitlines() if r.headers[REQUEST_ID] in x)
        assert " chat gpt-test 200 0 clamped, saved 0 chars, " in line and "hi" not in line


def test_budget_off_forwards_byte_identical_and_reports_would_clamp(
    tmp_path: Path, standin: StandIn
) -> None:
    config = base_config(tmp_path, standin.base_url, enabled=False, webFetchMaxChars=200)
    raw = _web_fetch_request(2000)
    with serve(tmp_path, config) as server:
        r = httpx.post(
            f"{server.base_url}/chat/completions",
            content=raw,
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 200
        assert standin.received[0].body == raw
        assert r.headers["x-context-budget-enabled"] == "false"
        assert r.headers["x-context-budget-clamped"] == "0"
        assert r.headers["x-context-budget-would-clamp"] == "1"
        assert int(r.headers["x-context-budget-would-save-chars"]) > 1000
        report = server.report()
        assert report["enabled"] is False
        assert report["totals"]["wouldClamp"] == 1
        assert report["totals"]["clamped"] == 0
        assert report["recent"][0]["segments"][0]["action"] == "would-clamp"

        # the per-request header turns it on
        standin.reset()
        r = httpx.post(
            f"{server.base_url}/chat/completions",
            content=raw,
            headers={"content-type": "application/json", "x-context-budget": "on"},
        )
        assert r.headers["x-context-budget-clamped"] == "1"
        assert standin.received[0].body != raw
        text = json.loads(standin.received[0].json["messages"][-1]["content"])["text"]
        assert len(text) <= 200


def _web_fetch_request(content_chars: int) -> bytes:
    from tests.openclaw import web_fetch_result

    content = web_fetch_result(
        version="9.x", url="https://example.com/a", content="lorem ipsum " * (content_chars // 12)
    )
    body = {
        "model": "gpt-test",
        "messages": [
            {"role": "user", "content": "fetch it"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "callwebfetch1",
                        "type": "function",
                        "function": {
                            "name": "web_fetch",
                            "arguments": '{"url":"https://example.com/a"}',
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "callwebfetch1", "content": content},
        ],
    }
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def test_upstream_unreachable_is_502(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with serve(tmp_path, base_config(tmp_path, dead)) as server:
        client = _client(server.base_url, max_retries=0)
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert info.value.status_code == 502
        assert "unreachable" in info.value.message
        assert server.report()["totals"]["upstreamErrors"] == 1


@pytest.mark.parametrize("wire", ["chat", "messages"])
def test_a_growing_conversation_reaches_the_upstream_byte_for_byte(
    tmp_path: Path, standin: StandIn, wire: str
) -> None:
    """A conversation's list is forwarded in pieces (`Parts`: what the last request sent of
    it, and the new items' bytes): the upstream gets the very bytes the in-process proxy
    forwards (checked there against a proxy with nothing kept), sized by a Content-Length,
    not chunked."""
    import sys

    from tests.inproc import config_for, proxy_app

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from bench._growing import BUILDERS

    route, build = BUILDERS[wire]
    bodies = build(40)
    budget = {"enabled": True, "webFetchMaxChars": 1200, "toolOutputMaxChars": 900}
    expected = []
    (tmp_path / "inproc").mkdir()
    inproc = config_for(
        tmp_path / "inproc",
        agents={"defaults": {"contextBudget": budget}},
        memory={"inject": {"enabled": False}},
    )
    headers = {
        "content-type": "application/json",
        "anthropic-version": "2023-06-01",
        "x-api-key": "sk-ant-client",
    }
    with proxy_app(tmp_path / "inproc", inproc) as (client, fake):
        for raw in bodies:
            fake.answer_json({"id": "x", "usage": {}})
            assert client.post(route, content=raw, headers=headers).status_code == 200
            expected.append(fake.last.body)
    config = standin_config(tmp_path, standin)
    config["agents"] = {"defaults": {"contextBudget": budget}}
    config["memory"]["inject"] = {"enabled": False}
    with serve(tmp_path, config, env={"CTXBUDGET_CHECK_RESENT": "1"}) as server:
        for n, raw in enumerate(bodies):
            standin.reset()
            r = httpx.post(f"{server.root}{route}", content=raw, headers=headers, timeout=30)
            assert r.status_code == 200, r.text
            (got,) = standin.received
            assert got.body == expected[n], f"request {n}"
            assert got.headers["content-length"] == str(len(got.body))
            assert "transfer-encoding" not in got.headers
    assert len(expected[-1]) > 100_000 and expected[-1] != bodies[-1]  # grown, and clamped
