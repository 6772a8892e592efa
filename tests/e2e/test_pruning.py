"""contextPruning through the real server, on the real clock (a 5-second cache lifetime: a
second one counted a request slowed by a busy machine as a cold gap),
with the `anthropic` SDK: a result pruned once the cache expired goes out the same way on
every later request, also from a second worker of the same server."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anthropic
import pytest

from tests.e2e.server import serve, standin_config
from tests.proxy.pipeline.test_prune import _messages
from tests.standin import StandIn

pytestmark = pytest.mark.e2e
TTL, TTL_SECONDS = "5s", 5.0


def _results(body: dict[str, Any]) -> dict[str, str]:
    return {
        b["tool_use_id"]: str(b["content"])
        for m in body["messages"]
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    }


def _pruned(results: dict[str, str]) -> list[str]:
    return [i for i, text in results.items() if "tool result pruned" in text]


def test_a_result_pruned_after_an_expiry_goes_out_the_same_way_after(
    tmp_path: Path, standin: StandIn
) -> None:
    config = standin_config(tmp_path, standin)
    config["agents"]["defaults"]["contextPruning"] = {"ttl": TTL}
    config["memory"]["inject"] = {"enabled": False}
    with (
        serve(tmp_path, config, workers=2) as server,
        anthropic.Anthropic(base_url=server.root, api_key="sk-ant", max_retries=0) as client,
    ):

        def send(turns: int) -> dict[str, str]:
            body = _messages(turns)
            client.messages.create(**body)
            return _results(standin.received[-1].json)

        assert _pruned(send(5)) == []
        assert _pruned(send(6)) == []  # warm: nothing pruned
        time.sleep(TTL_SECONDS + 1)  # the cache's lifetime passes
        first = send(7)
        assert _pruned(first) == ["toolu_0", "toolu_1", "toolu_2", "toolu_3"]
        for turns in (8, 9, 10, 11):  # warm again; either worker may serve each one
            later = send(turns)
            assert {i: later[i] for i in first} == first
        deadline = time.monotonic() + 30
        while len((report := server.report())["recent"]) < 7:  # the writer thread's pace
            assert time.monotonic() < deadline, report["recent"]
            time.sleep(0.1)
    pruned = [s for r in report["recent"] for s in r["segments"] if s["kind"] == "pruned"]
    assert {s["note"] for s in pruned} == {"pruned now", "pruned earlier"}
    assert sum(s["note"] == "pruned now" for s in pruned) == 4


def test_a_second_instance_sends_a_pruned_result_the_same_way(
    tmp_path: Path, standin: StandIn
) -> None:
    # Two proxies on one report database: the decision the first made, the second finds under
    # the same conversation (each process has its own digest seed; the ids must not).
    config = standin_config(tmp_path, standin)
    config["agents"]["defaults"]["contextPruning"] = {"ttl": TTL}
    config["memory"]["inject"] = {"enabled": False}
    with (
        serve(tmp_path, config) as first,
        serve(tmp_path, config) as second,
        anthropic.Anthropic(base_url=first.root, api_key="sk-ant", max_retries=0) as one,
        anthropic.Anthropic(base_url=second.root, api_key="sk-ant", max_retries=0) as two,
    ):

        def send(client: anthropic.Anthropic, turns: int) -> dict[str, str]:
            client.messages.create(**_messages(turns))
            return _results(standin.received[-1].json)

        send(one, 5)
        send(one, 6)
        time.sleep(TTL_SECONDS + 1)  # the cache's lifetime passes
        pruned = send(one, 7)
        assert _pruned(pruned) == ["toolu_0", "toolu_1", "toolu_2", "toolu_3"]
        first.report()  # its record written: the second proxy reads when the session was seen
        done = {i: pruned[i] for i in _pruned(pruned)}
        for turns in (8, 9):  # what the first pruned, the second sends the same way
            later = send(two, turns)
            assert {i: later[i] for i in done} == done
