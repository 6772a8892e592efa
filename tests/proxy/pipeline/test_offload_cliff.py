"""The offload is decided on the work left to do, not on the body's size: a conversation that
grows past `LARGE_BODY` a turn at a time is read here as its history plus the new turn
(`proxy/wire/history.py`), so it stays in this process, with its cache mirror and the same
forwarded bytes; a body whose new part is large still goes to the worker."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from ctxbudget.proxy.pipeline.offload import LARGE_BODY, Offload
from tests.fakes import chat_completion
from tests.inproc import InProcess, config_for, proxy_app, shared_offload, state_of
from tests.openclaw import openclaw_request, tool_call
from tests.proxy.wire import test_messages as test_wire_messages

RESULT = 60_000
"""Bytes of each tool result the conversation grows by."""


def _result(turn: int, size: int = RESULT) -> str:
    line = f"line {turn}: the file's text, read by the agent's tool, word after word\n"
    return (line * (size // len(line) + 1))[:size]


def _grow_chat(body: dict[str, Any], turn: int, size: int = RESULT) -> dict[str, Any]:
    """`body` with one more tool call and its result before OpenClaw's context message (the
    next request of the tool loop)."""
    *history, context = body["messages"]
    call = f"call{turn}"
    messages = [
        *history,
        tool_call(call, "read", {"path": f"/home/agent/src/module_{turn}.py"}),
        {"role": "tool", "tool_call_id": call, "content": _result(turn, size)},
        context,
    ]
    return {**body, "messages": messages}


def _grow_messages(body: dict[str, Any], turn: int, size: int = RESULT) -> dict[str, Any]:
    """`body` (Anthropic Messages) with one more tool use and its result, the cache marker
    moved to the newest result as OpenClaw moves it."""
    call = f"toolu{turn}"
    use = {"type": "tool_use", "id": call, "name": "read", "input": {"path": f"m{turn}.py"}}
    result = {
        "type": "tool_result",
        "tool_use_id": call,
        "content": _result(turn, size),
        "cache_control": {"type": "ephemeral"},
    }
    *history, last = body["messages"]
    if last["role"] == "user" and isinstance(last["content"], list):
        parts = [{k: v for k, v in p.items() if k != "cache_control"} for p in last["content"]]
        last = {**last, "content": parts}
    messages = [
        *history,
        last,
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": [result]},
    ]
    return {**body, "messages": messages}


def _chat_reply(size: int) -> dict[str, Any]:
    tokens = size // 4  # all but the newest 2,000 read from the provider's cache
    usage = {"prompt_tokens": tokens, "completion_tokens": 5,
             "prompt_tokens_details": {"cached_tokens": max(tokens - 2_000, 0)}}  # fmt: skip
    return {**chat_completion(), "usage": usage}


def _messages_reply(size: int) -> dict[str, Any]:
    tokens = size // 4
    cached = max(tokens - 2_000, 0)
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "ok"}],
        "usage": {
            "input_tokens": tokens - cached,
            "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0,
            "output_tokens": 5,
        },  # fmt: skip
    }


Grow = Callable[..., dict[str, Any]]
FORMATS: dict[str, tuple[str, Callable[[], dict[str, Any]], Grow, Callable[[int], Any]]] = {
    "chat": (
        "/v1/chat/completions",
        lambda: openclaw_request(stream=False),
        _grow_chat,
        _chat_reply,
    ),  # fmt: skip
    "messages": (
        "/v1/messages",
        lambda: {**test_wire_messages.request(), "stream": False},
        _grow_messages,
        _messages_reply,
    ),
}
"""Each format's route, first request, next request and reply (usage by the body's size)."""


def _conversation(first: dict[str, Any], grow: Grow, turns: int) -> list[dict[str, Any]]:
    """A tool loop whose body passes `LARGE_BODY` after its first few requests."""
    body = first
    turn = 0
    while len(orjson.dumps(body)) < LARGE_BODY - 3 * RESULT:
        body = grow(body, turn)
        turn += 1
    bodies = []
    for _ in range(turns):
        body = grow(body, turn)
        turn += 1
        bodies.append(body)
    return bodies


def _send(
    client: InProcess, fake: Any, path: str, body: dict[str, Any], reply: Callable[[int], Any]
) -> tuple[bytes, dict[str, Any]]:
    raw = orjson.dumps(body)
    fake.answer_json(reply(len(raw)))
    r = client.post(path, content=raw)
    assert r.status_code == 200, r.text
    state_of(client).reports.flush()
    entry = client.get(f"/context/budget/requests/{r.headers['x-context-budget-request-id']}")
    return fake.last.body or b"", entry.json()


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_conversation_growing_past_large_body_stays_in_process(tmp_path: Path, name: str) -> None:
    path, first, grow, reply = FORMATS[name]
    bodies = _conversation(first(), grow, 6)
    sizes = [len(orjson.dumps(b)) for b in bodies]
    assert sizes[0] < LARGE_BODY < sizes[3], sizes  # it crosses the threshold on the way
    offload = shared_offload()  # the default threshold, in the run's shared worker
    here = Offload(threshold=sys.maxsize, objects=sys.maxsize)  # every body on the loop
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with (
        proxy_app(tmp_path / "a", config_for(tmp_path / "a"), offload=offload) as (ours, fake),
        proxy_app(tmp_path / "b", config_for(tmp_path / "b"), offload=here) as (base, bare),
    ):
        jobs = offload.jobs
        for i, body in enumerate(bodies):
            sent, entry = _send(ours, fake, path, body, reply)
            expected, _ = _send(base, bare, path, body, reply)
            assert sent == expected, f"turn {i}: forwarded bodies differ"
            # parsed here: the session's cache mirror priced it (a body parsed in the worker
            # comes as digests, which it cannot always place)
            assert entry["mirrorDrift"] is not None, f"turn {i} ({sizes[i]} bytes) not mirrored"
        assert offload.jobs == jobs, "a turn of a known conversation went to the worker"

        # one new message of 2 MiB: the work left is large, the worker takes it
        big = grow(bodies[-1], 10_000, size=2 * LARGE_BODY)
        sent, _ = _send(ours, fake, path, big, reply)
        expected, _ = _send(base, bare, path, big, reply)
        assert sent == expected
        assert offload.jobs > jobs


@pytest.mark.parametrize(
    ("tail", "status"),
    [
        (b',"messages":[{"role":"user","content":"hi"}]}', 200),  # the key given again
        (b', "x": NaN}', 400),  # not JSON after the old items: the stdlib parser's turn
    ],
)
def test_a_body_repeating_a_known_conversation_that_does_not_extend_it_goes_to_the_worker(
    tmp_path: Path, tail: bytes, status: int
) -> None:
    """The offload asks only how many bytes follow the owner's old items (a memcmp), but a
    body whose rest is not the list's extension is read whole: a large one must be read in
    the worker then, not scanned (or, when msgspec refuses it, parsed by the stdlib) on the
    event loop."""
    path, first, grow, reply = FORMATS["chat"]
    bodies = _conversation(first(), grow, 4)
    offload = shared_offload()
    with proxy_app(tmp_path, config_for(tmp_path), offload=offload) as (client, fake):
        for body in bodies:
            _send(client, fake, path, body, reply)
        raw = orjson.dumps(bodies[-1])
        assert len(raw) > LARGE_BODY
        odd = raw[:-1] + tail  # the same bytes up to past every item, then another ending
        jobs = offload.jobs
        fake.answer_json(reply(len(odd)))
        r = client.post(path, content=odd)
        assert r.status_code == status, r.text
        if status == 400:
            assert r.json()["error"]["type"] == "invalid_request_error"
        assert offload.jobs > jobs, "a large body not read as an extension was read here"
