"""The provider's usage in each request's report entry, through the real server in front of
the stand-in (which bills like the providers, cache reads and writes included), read from
what each official SDK itself received."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import orjson
import pytest

from tests.e2e.server import ProxyServer, sdk, serve, standin_config
from tests.openclaw import system_prompt
from tests.standin import StandIn, tokens_of


@pytest.fixture
def server(tmp_path: Path, standin: StandIn) -> Iterator[ProxyServer]:
    with serve(tmp_path, standin_config(tmp_path, standin)) as running:
        yield running


def latest_usage(server: ProxyServer) -> Any:
    return server.report()["recent"][0]["usage"]


def test_chat_stream_gets_usage_the_client_did_not_ask_for(
    server: ProxyServer, standin: StandIn
) -> None:
    # over 1,024 tokens, so that OpenAI's automatic caching keeps it
    ask = {"role": "user", "content": "hi " * 1200}
    body = {"model": "gpt-x", "stream": True, "messages": [ask]}
    headers = {"authorization": "Bearer sk-client"}
    with httpx.stream(
        "POST", f"{server.base_url}/chat/completions", json=body, headers=headers, timeout=30
    ) as r:
        raw = b"".join(r.iter_raw())
    assert standin.last_json["stream_options"] == {"include_usage": True}
    events = [e for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    assert all(orjson.loads(e[6:])["choices"] for e in events[:-1])  # no usage-only chunk
    assert b'"usage"' not in raw
    # the stand-in bills o200k_base tokens of each block's canonical JSON
    prompt = tokens_of(json.dumps(["message", body["messages"][0]], sort_keys=True))
    output = tokens_of("standin: received 1 messages")
    assert latest_usage(server) == {
        "input": prompt,
        "cacheRead": 0,
        "cacheWrite": 0,
        "output": output,
        "cacheWrite1h": 0,
    }

    client = sdk(base_url=server.base_url, api_key="sk-client", max_retries=0)
    chunks = list(
        client.chat.completions.create(
            **{**body, "stream_options": {"include_usage": True}}  # type: ignore[arg-type]
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == prompt
    # the same prompt again: read from the cache in 128-token steps, all but its last token
    cached = (prompt - 1) // 128 * 128
    assert latest_usage(server) == {
        "input": prompt - cached,
        "cacheRead": cached,
        "cacheWrite": 0,
        "output": output,
        "cacheWrite1h": 0,
    }


def test_messages_usage_with_cache_reads_and_writes(server: ProxyServer) -> None:
    with anthropic.Anthropic(
        base_url=server.root, api_key="sk-ant-client", max_retries=0
    ) as client:
        first, *later = messages_usage(server, client)
    # the first request writes the cached system prompt; the next two read all of it
    assert first.cache_creation_input_tokens > 1000 and not first.cache_read_input_tokens
    for usage in later:
        assert usage.cache_read_input_tokens == first.cache_creation_input_tokens
        assert not usage.cache_creation_input_tokens
        assert usage.input_tokens == first.input_tokens


def messages_usage(server: ProxyServer, client: anthropic.Anthropic) -> list[Any]:
    """The usage of one JSON request and two streamed ones of the same cached prompt, each
    checked against what the report recorded."""
    body: dict[str, Any] = {
        "model": "claude-test",
        "max_tokens": 64,
        "system": [
            {"type": "text", "text": system_prompt(), "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [{"role": "user", "content": "hello"}],
    }
    usages = []
    for stream in (False, True, True):
        if stream:
            with client.messages.stream(**body) as s:
                usage = s.get_final_message().usage
        else:
            usage = client.messages.create(**body).usage
        assert latest_usage(server) == {
            "input": usage.input_tokens,
            "cacheRead": usage.cache_read_input_tokens or 0,
            "cacheWrite": usage.cache_creation_input_tokens or 0,
            "output": usage.output_tokens,
            "cacheWrite1h": getattr(usage.cache_creation, "ephemeral_1h_input_tokens", 0),
        }
        usages.append(usage)
    return usages


def test_responses_usage_with_cache_reads(server: ProxyServer) -> None:
    client = sdk(base_url=server.base_url, api_key="sk-client", max_retries=0)
    items: Any = [
        {"type": "message", "role": "system", "content": system_prompt()},
        {"type": "message", "role": "user", "content": "hello"},
    ]
    for stream in (False, True):
        if stream:
            events = list(client.responses.create(model="gpt-x", input=items, stream=True))
            usage = events[-1].response.usage  # type: ignore[union-attr]
        else:
            usage = client.responses.create(model="gpt-x", input=items).usage
        assert usage is not None
        cached = usage.input_tokens_details.cached_tokens
        assert latest_usage(server) == {
            "input": usage.input_tokens - cached,
            "cacheRead": cached,
            "cacheWrite": 0,
            "output": usage.output_tokens,
            "cacheWrite1h": 0,
        }
    assert cached
