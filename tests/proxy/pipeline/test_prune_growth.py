"""A pruned conversation's requests are O(new) (issue 34): once a prune has acted, each later
request applies the decisions again to the results it repeats as the last request did (the
same bytes), looking only at its new turn, not at the whole history; and what it sends is what
the whole pass sends (the suite's `CTXBUDGET_CHECK_RESENT=1` re-runs each carried prune whole
and fails on a difference)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from ctxbudget.caps import prune as caps_prune
from ctxbudget.proxy.cache.resent import RESENT
from ctxbudget.proxy.pipeline import prune
from ctxbudget.proxy.wire import view
from tests.inproc import Counted, proxy_app
from tests.proxy.pipeline.test_prune import (
    Clock,
    _chat,
    _config,
    _messages,
    _responses,
    _send,
)

PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}
BUILD = {"chat": _chat, "messages": _messages, "responses": _responses}


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counted]:
    found = Counted(monkeypatch)
    # as in production: the suite's re-check of every reuse works the whole list again
    monkeypatch.setattr(RESENT, "check", False)
    found.count(prune, "_key")  # a prunable result looked up among the decisions
    found.count(view.ChatView, "result")  # a tool result put in a Messages or Responses view
    apply = caps_prune.apply

    def applied(messages: list[Any], *args: Any, **kwargs: Any) -> Any:
        found.calls["applied"] = found.calls.get("applied", 0) + len(messages)
        return apply(messages, *args, **kwargs)

    monkeypatch.setattr(caps_prune, "apply", applied)
    yield found


@pytest.mark.parametrize("wire", ["chat", "messages", "responses"])
def test_a_request_after_a_prune_looks_only_at_its_new_turn(
    tmp_path: Path, wire: str, counted: Counted
) -> None:
    """A cold gap at turn 6 prunes the first results; the conversation then grows warm to turn
    24: its last request sends the pruned results as decided, and what the prune's second pass
    looks at (the results it views, the messages it applies decisions to, the prunable results
    it looks up) is the new turn's few, not the 48 messages of the history."""
    clock = Clock()
    with proxy_app(tmp_path, _config(tmp_path), clock=clock) as (client, fake):
        for turns in range(1, 25):
            clock.wait(600 if turns == 6 else 10)
            counted.calls.clear()
            _send(client, fake, PATHS[wire], BUILD[wire](turns))
        sent = orjson.loads(fake.last.body)
    texts = [
        str(m.get("content", m.get("output"))) for m in sent.get("messages", sent.get("input"))
    ]
    assert sum("tool result pruned" in t for t in texts) == 3  # the prune of turn 6 stands
    assert counted.calls.get("applied", 0) <= 4, counted.calls
    assert counted.calls.get("_key", 0) <= 4, counted.calls
    assert counted.calls.get("result", 0) <= 4, counted.calls


def test_a_new_turn_naming_a_decided_call_is_pruned_as_the_whole_pass_prunes(
    tmp_path: Path,
) -> None:
    """A new turn whose result has a decided call id and the very text the decision was taken
    for (a client numbering its calls `call_0`, … again) gets the decision, as a pass over the
    whole list gives it: the carried pass works such a request whole."""
    clock = Clock()
    with proxy_app(tmp_path, _config(tmp_path), clock=clock) as (client, fake):
        for turns in (5, 6, 7):
            clock.wait(600 if turns == 6 else 10)
            _send(client, fake, PATHS["chat"], _chat(turns))
        again = _chat(8)
        repeated = [m for m in again["messages"] if m.get("tool_call_id") == "call_0"][0]
        again["messages"] += [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_0", "type": "function",
                 "function": {"name": "exec", "arguments": '{"cmd": "pytest"}'}}]},
            dict(repeated),
            {"role": "assistant", "content": "done"},
        ]  # fmt: skip
        clock.wait(10)
        _send(client, fake, PATHS["chat"], again)
        sent = orjson.loads(fake.last.body)
    results = [m["content"] for m in sent["messages"] if m.get("tool_call_id") == "call_0"]
    assert len(results) == 2 and results[0] == results[1]
    assert "tool result pruned" in results[1]
