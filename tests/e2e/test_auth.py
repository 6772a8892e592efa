"""Keys: the upstream key replaces the client's; proxy keys gate access."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.server import base_config, sdk, serve
from tests.standin import StandIn

HELLO = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_client_key_is_forwarded_without_an_upstream_key(tmp_path: Path, standin: StandIn) -> None:
    with serve(tmp_path, base_config(tmp_path, standin.base_url)) as server:
        sdk(base_url=server.base_url, api_key="sk-client").chat.completions.create(**HELLO)
    assert standin.received[0].headers["authorization"] == "Bearer sk-client"


def test_configured_upstream_key_replaces_the_clients(tmp_path: Path, standin: StandIn) -> None:
    config = base_config(tmp_path, standin.base_url)
    config["proxy"]["upstream"]["apiKeyEnv"] = "TEST_UPSTREAM_KEY"
    with serve(tmp_path, config, env={"TEST_UPSTREAM_KEY": "sk-upstream"}) as server:
        sdk(base_url=server.base_url, api_key="sk-client").chat.completions.create(**HELLO)
        report = httpx.get(f"{server.root}/context/budget?format=text").text
        log = server.output()
    assert standin.received[0].headers["authorization"] == "Bearer sk-upstream"
    assert "sk-upstream" not in report and "sk-upstream" not in log


def test_proxy_keys_gate_access(tmp_path: Path, standin: StandIn) -> None:
    config = base_config(tmp_path, standin.base_url)
    config["proxy"]["upstream"]["apiKeyEnv"] = "TEST_UPSTREAM_KEY"
    env = {"CTXBUDGET_PROXY_KEYS": "pk-one, pk-two", "TEST_UPSTREAM_KEY": "sk-upstream"}
    with serve(tmp_path, config, env=env) as server:
        client = sdk(base_url=server.base_url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as info:
            client.chat.completions.create(**HELLO)
        assert "missing or unknown proxy key" in info.value.message
        anonymous = httpx.post(f"{server.base_url}/chat/completions", json=HELLO)
        assert anonymous.status_code == 401
        assert anonymous.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{server.root}/context/budget").status_code == 401
        assert httpx.get(f"{server.root}/healthz").status_code == 200
        assert standin.received == []
        client = sdk(base_url=server.base_url, api_key="pk-two")
        client.chat.completions.create(**HELLO)
        r = httpx.get(f"{server.root}/context/budget", headers={"authorization": "Bearer pk-one"})
        assert r.status_code == 200
        # the report page: a browser is asked for the key (HTTP Basic, key as the password)
        page = f"{server.root}/context/budget?format=html"
        asked = httpx.get(page)
        assert asked.status_code == 401
        assert asked.headers["www-authenticate"] == 'Basic realm="ctxbudget report"'
        assert httpx.get(page, auth=("me", "pk-wrong")).status_code == 401
        shown = httpx.get(page, auth=("me", "pk-one"))
        assert shown.status_code == 200 and shown.text.startswith("<!doctype html>")
        basic_json = httpx.get(f"{server.root}/context/budget", auth=("me", "pk-one"))
        assert basic_json.status_code == 401, "Basic is for the page only"
        assert "www-authenticate" not in basic_json.headers
    assert standin.received[0].headers["authorization"] == "Bearer sk-upstream"


def test_a_key_cannot_continue_another_keys_stored_response(
    tmp_path: Path, standin: StandIn
) -> None:
    """Every key reaches the upstream with the one upstream key, which continues any stored
    response whose id it is given: bob could read on in alice's conversation (issue 24,
    item 12)."""
    config = base_config(tmp_path, standin.base_url)
    config["proxy"]["upstream"]["apiKeyEnv"] = "TEST_UPSTREAM_KEY"
    env = {"CTXBUDGET_PROXY_KEYS": "alice=pk-a,bob=pk-b", "TEST_UPSTREAM_KEY": "sk-upstream"}
    with serve(tmp_path, config, env=env) as server:
        alice = sdk(base_url=server.base_url, api_key="pk-a", max_retries=0)
        bob = sdk(base_url=server.base_url, api_key="pk-b", max_retries=0)
        first = alice.responses.create(model="m", input="my secret plan")
        with alice.responses.stream(model="m", input="another") as events:
            second = events.get_final_response()
        for taken in (first.id, second.id):
            with pytest.raises(openai.BadRequestError) as refused:
                bob.responses.create(model="m", input="go on", previous_response_id=taken)
            assert refused.value.code == "previous_response_not_found"
            assert refused.value.param == "previous_response_id"
        assert len(standin.received) == 2  # bob's continuations never went upstream
        mine = alice.responses.create(model="m", input="go on", previous_response_id=first.id)
        assert mine.output_text
        # an id the upstream does not know: the upstream's own answer, worded the same
        with pytest.raises(openai.BadRequestError) as unknown:
            bob.responses.create(model="m", input="go on", previous_response_id="resp_nobody")
        assert unknown.value.code == "previous_response_not_found"
