"""`ctxbudget demo`'s pieces: the bundled session is the OpenClaw builder's, the built-in
upstream bills like OpenAI (cached prefix included), and the demo's files are temporary."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from ctxbudget.proxy.config.schema import ConfigSource
from ctxbudget.proxy.demo.run import demo_config, sample_requests
from ctxbudget.proxy.demo.upstream import DemoUpstream, create_upstream
from tests.inproc import InProcess
from tests.openclaw import sample_session


def test_the_bundled_session_is_built_by_the_openclaw_builder() -> None:
    shipped = json.loads(
        (resources.files("ctxbudget.proxy.demo") / "sample-session.json").read_text()
    )
    assert shipped == sample_session(), "regenerate: python -m tests.openclaw > proxy/demo/…"
    requests = sample_requests()
    assert len(requests) == 4
    assert all(r["messages"][-1] == shipped["internal"] for r in requests)
    # a tool loop: each request resends the one before it and adds a call and its result
    for before, after in zip(requests, requests[1:], strict=False):
        assert after["messages"][: len(before["messages"]) - 1] == before["messages"][:-1]


def test_the_upstream_bills_prompt_and_cached_prefix_json_and_sse() -> None:
    state = DemoUpstream()
    client = InProcess(create_upstream(state))
    first, second = sample_requests()[:2]
    try:
        r = client.post("/v1/chat/completions", json={**first, "stream": False})
        usage = r.json()["usage"]
        assert usage["prompt_tokens"] > 5_000
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0
        streamed = client.post("/v1/chat/completions", json=second)
        events = [e for e in streamed.text.split("\n\n") if e]
    finally:
        client.close()
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2].removeprefix("data: "))
    assert last["choices"] == [] and last["usage"] == state.billed[-1]
    # the tools, system prompt and user turn were seen: read from the (imitated) cache
    cached = last["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert usage["prompt_tokens"] - 200 < cached < usage["prompt_tokens"]


def test_the_demo_config_keeps_everything_in_its_temporary_directory(tmp_path: Path) -> None:
    path = tmp_path / "ctxbudget.jsonc"
    path.write_text(json.dumps(demo_config(tmp_path, "http://127.0.0.1:9/v1", 0)))
    cfg = ConfigSource(path, {}, {}).get()
    assert cfg.report.path.parent == tmp_path and cfg.memory.store.path.parent == tmp_path
    assert cfg.database.url is None and cfg.proxy.upstream.api_key_env is None
    assert cfg.agents.defaults.context_budget.enabled
