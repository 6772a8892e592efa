"""A model routed through litellm to a provider with its own wire format (Anthropic)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.checks import bootstrap_bodies, u16
from tests.e2e.server import base_config, sdk, serve
from tests.openclaw import openclaw_request
from tests.standin import StandIn


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_routed_model_goes_through_litellm_with_caps(
    tmp_path: Path, standin: StandIn, stream: bool
) -> None:
    config = base_config(tmp_path, standin.base_url)
    config["proxy"]["routes"] = {
        "claude-via-proxy": {
            "model": "anthropic/claude-3-5-sonnet-20240620",
            "apiBase": standin.anthropic_api_base,
            "apiKeyEnv": "TEST_ANTHROPIC_KEY",
        }
    }
    body = openclaw_request(version="9.x", stream=stream)
    body["model"] = "claude-via-proxy"
    if not stream:
        body.pop("stream_options", None)
    with serve(tmp_path, config, env={"TEST_ANTHROPIC_KEY": "sk-ant-test"}) as server:
        client = sdk(base_url=server.base_url, api_key="sk-client")
        raw = client.chat.completions.with_raw_response.create(**body)
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
        else:
            text = raw.parse().choices[0].message.content or ""
        report = server.report()
    assert text.startswith("standin")
    got = standin.received[-1]
    assert got.path == "/v1/messages"
    assert got.headers["x-api-key"] == "sk-ant-test"
    assert got.json["model"] == "claude-3-5-sonnet-20240620"
    system = got.json["system"]
    system_text = system if isinstance(system, str) else "".join(b["text"] for b in system)
    bodies = bootstrap_bodies(system_text)
    assert bodies, "the system prompt reached Anthropic's top-level `system`"
    assert all(u16(b) <= 8000 for b in bodies.values())
    assert int(raw.headers["x-context-budget-clamped"]) >= 1
    assert report["recent"][0]["route"] == "anthropic/claude-3-5-sonnet-20240620"
