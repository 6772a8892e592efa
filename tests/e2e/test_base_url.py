"""A base URL that carries credentials and a query string, through the real server: what the
upstream receives, and that no secret of it shows to a client or in the log (issue 24,
item 10)."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx

from tests.e2e.server import sdk, serve, standin_config
from tests.standin import StandIn

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_credentials_and_query_of_a_base_url_reach_the_upstream_and_nothing_else(
    tmp_path: Path, standin: StandIn
) -> None:
    config = standin_config(tmp_path, standin)
    host = f"127.0.0.1:{standin.port}"
    config["proxy"]["upstream"]["baseUrl"] = f"http://gw:Z9pass@{host}/v1?token=Z9tok"
    config["proxy"]["anthropic"]["baseUrl"] = f"http://gw:Z9pass@{host}?token=Z9ant"
    basic = "Basic " + base64.b64encode(b"gw:Z9pass").decode()
    with serve(tmp_path, config) as server:
        # the client's own key: it is the credential sent (this was a 500 on every request)
        reply = sdk(base_url=server.base_url, api_key="sk-client", max_retries=0)
        answer = reply.chat.completions.create(**CHAT)  # type: ignore[call-overload]
        assert answer.choices[0].message.content == "standin: received 1 messages"
        # no credential of its own: the base URL's user info, as HTTP Basic
        plain = httpx.post(f"{server.base_url}/chat/completions", json=CHAT, timeout=30)
        assert plain.status_code == 200, plain.text
        models = httpx.get(f"{server.base_url}/models", headers={"authorization": "Bearer sk-c"})
        assert models.status_code == 200, models.text
        # Messages with an x-api-key only (no Authorization): the user info goes as Basic
        ask = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
        headers = {"x-api-key": "sk-ant", "anthropic-version": "2023-06-01"}
        claude = httpx.post(f"{server.base_url}/messages", json=ask, headers=headers, timeout=30)
        assert claude.status_code == 200, claude.text

        got = [(r.path, r.query, r.headers.get("authorization")) for r in standin.received]
        assert got == [
            ("/v1/chat/completions", "token=Z9tok", "Bearer sk-client"),
            ("/v1/chat/completions", "token=Z9tok", basic),
            ("/v1/models", "token=Z9tok", "Bearer sk-c"),
            ("/v1/messages", "token=Z9ant", basic),
        ]
        assert standin.received[-1].headers["x-api-key"] == "sk-ant"

        # an upstream that answers 404: the error names the URL, its secrets hidden
        config["proxy"]["upstream"]["baseUrl"] = f"http://gw:Z9pass@{host}/nope?token=Z9tok"
        server.write_config(config)
        missing = httpx.get(f"{server.base_url}/models", timeout=30)
        assert missing.status_code == 404
        message = missing.json()["error"]["message"]
        assert f"upstream http://***@{host}/nope/models?token=*** returned HTTP 404" in message
        failed = httpx.post(f"{server.base_url}/chat/completions", json=CHAT, timeout=30)
        assert failed.status_code == 404 and "Z9" not in failed.text
        report = httpx.get(f"{server.root}/context/budget", timeout=30).text
        output = server.output()
    assert "Z9" not in report
    assert f"→ http://***@{host}/v1?token=***" in output  # the start-up line
    assert "Z9" not in output
