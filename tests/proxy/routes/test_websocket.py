"""A WebSocket handshake on any path is refused with 426 and an error naming the fix (Codex
falls back to HTTP at once on 426; on uvicorn's default 403 it retried for ~6 s)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient, WebSocketDenialResponse

from ctxbudget.caps import clamp_request
from ctxbudget.proxy.app import create_app
from ctxbudget.proxy.config.schema import ConfigSource
from tests.fakes import FakeUpstream
from tests.inproc import config_for, shared_offload


@pytest.mark.parametrize("path", ["/v1/responses", "/responses", "/anything/else"])
def test_a_websocket_handshake_is_refused_with_426(tmp_path: Path, path: str) -> None:
    config = tmp_path / "ctxbudget.json"
    config.write_text(json.dumps(config_for(tmp_path)))
    app = create_app(
        ConfigSource(config, {}, {}),
        upstream=FakeUpstream(),
        env={},
        clamp=clamp_request,
        run="test",
        offload=shared_offload(),
    )
    headers = {"openai-beta": "responses_websockets=2026-02-06", "authorization": "Bearer k"}
    with TestClient(app) as client, pytest.raises(WebSocketDenialResponse) as refused:
        with client.websocket_connect(path, headers=headers):
            pass
    assert refused.value.status_code == 426
    error = refused.value.json()["error"]
    assert error["code"] == "websocket_not_supported"
    assert "supports_websockets" in error["message"]
