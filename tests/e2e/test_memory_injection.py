"""Memories added by people reach the upstream inside the request, cache-safely."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.server import CTXBUDGET, base_config, serve
from tests.openclaw import openclaw_request, tool_call
from tests.standin import StandIn


def _add(config: Path, text: str, *args: str) -> None:
    out = subprocess.run(
        [CTXBUDGET, "memory", "add", text, "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr


def _turn(question: str) -> dict[str, Any]:
    body = openclaw_request(version="9.x", stream=False)
    body["messages"] = [
        body["messages"][0],
        {"role": "user", "content": f"[Sun 2026-11-22 11:28 UTC] {question}"},
        body["messages"][-1],
    ]
    return body


def test_memories_are_injected_into_the_last_user_message(tmp_path: Path, standin: StandIn) -> None:
    # memory injection is its own switch: on while the caps are off
    with serve(tmp_path, base_config(tmp_path, standin.base_url, enabled=False)) as server:
        _add(server.config_path, "Therapy is on Thursdays at 3pm", "--category", "preference")
        _add(server.config_path, "The zebra project deadline is Friday the 28th")
        _add(server.config_path, "Prefers dark roast coffee", "--category", "preference")
        body = _turn("When is my therapy appointment this week?")
        r = httpx.post(f"{server.base_url}/chat/completions", json=body)
        assert r.status_code == 200
        assert r.headers["x-context-budget-memories"] == "1"
        got = standin.received[-1].json["messages"]
        assert got[:-1] == body["messages"][:-1], "system prompt and earlier turns untouched"
        last = got[-1]["content"][-1]["text"]
        assert last.startswith("User context:\n- Preference: Therapy is on Thursdays at 3pm (")
        assert last.endswith(", you told me)")
        report = server.report()["recent"][0]["memory"]
        assert report["injected"] == 1 and report["candidates"] >= 1
        assert "Therapy" not in json.dumps(server.report()), "memory text stays out of the report"


def test_a_tool_loop_keeps_an_identical_prefix_and_counts_one_access(
    tmp_path: Path, standin: StandIn
) -> None:
    with serve(tmp_path, base_config(tmp_path, standin.base_url)) as server:
        _add(server.config_path, "The zebra project deadline is Friday the 28th")
        first = _turn("check the zebra project deadline")
        httpx.post(f"{server.base_url}/chat/completions", json=first)
        second = dict(first)
        second["messages"] = [
            *first["messages"][:2],
            tool_call("callmemorysearch1", "memory_search", {"query": "zebra"}),
            {"role": "tool", "tool_call_id": "callmemorysearch1", "content": '{"results": []}'},
            first["messages"][-1],
        ]
        httpx.post(f"{server.base_url}/chat/completions", json=second)
        a, b = (standin.received[-2].json["messages"], standin.received[-1].json["messages"])
        assert a[:2] == b[:2], "the cached prefix is byte-identical across the tool loop"
        assert a[-1] == b[-1] and "zebra" in a[-1]["content"][-1]["text"]
        memories = httpx.get(f"{server.base_url}/memories").json()["data"]
        assert memories[0]["accessCount"] == 1, "one user turn counts one access"


def test_profiles_change_what_is_retrieved(tmp_path: Path, standin: StandIn) -> None:
    with serve(tmp_path, base_config(tmp_path, standin.base_url)) as server:
        _add(server.config_path, "Deploy releases happen on Tuesdays after standup")
        body = _turn("when is the stand meeting?")  # 'stand' matches only as deep's prefix
        for profile, expected in (("lean", "0"), ("deep", "1")):
            r = httpx.post(
                f"{server.base_url}/chat/completions",
                json=body,
                headers={"x-context-budget-profile": profile},
            )
            assert r.headers["x-context-budget-memories"] == expected, profile
            assert r.headers["x-context-budget-profile"] == profile


def test_system_placement(tmp_path: Path, standin: StandIn) -> None:
    config = base_config(tmp_path, standin.base_url)
    config["memory"]["inject"] = {"placement": "system"}
    with serve(tmp_path, config) as server:
        _add(server.config_path, "Therapy is on Thursdays at 3pm", "--category", "preference")
        httpx.post(f"{server.base_url}/chat/completions", json=_turn("therapy time?"))
        system = standin.received[-1].json["messages"][0]["content"]
        assert system.endswith(
            "\n\nUser context:\n- Preference: Therapy is on Thursdays at 3pm (today, you told me)"
        )


def test_agent_budget_and_context_window_bound_the_injection(
    tmp_path: Path, standin: StandIn
) -> None:
    config = base_config(tmp_path, standin.base_url, enabled=False)
    config["memory"]["budgets"] = {"contextWindows": {"tiny-model": 6100}}
    with serve(tmp_path, config) as server:
        for i in range(8):
            _add(server.config_path, f"Deploy note {i}: deploys need a green build and a review")
        body = _turn("how do deploys work here?")
        body["model"] = "tiny-model"  # the system prompt alone is ~5,900 of its 6,100 tokens
        r = httpx.post(
            f"{server.base_url}/chat/completions",
            json=body,
            headers={"x-context-budget-complexity": "simple", "x-context-budget-profile": "deep"},
        )
        memory = server.report()["recent"][0]["memory"]
        assert memory["budget"]["complexity"] == "simple"
        assert memory["budget"]["boundBy"].startswith("20% of the context window left")
        assert memory["tokens"] <= memory["budget"]["tokens"]
        assert memory["boundBy"].startswith("token budget")
        assert int(r.headers["x-context-budget-memories"]) == memory["injected"] < 8
        bad = httpx.post(
            f"{server.base_url}/chat/completions",
            json=body,
            headers={"x-context-budget-complexity": "huge"},
        )
        assert bad.status_code == 400


def test_monitor_bumps_after_exceeding_and_analyze_recommends(
    tmp_path: Path, standin: StandIn
) -> None:
    config = base_config(tmp_path, standin.base_url, enabled=False)
    config["memory"]["budgets"] = {"contextWindows": {"tiny-model": 6100}}
    with serve(tmp_path, config) as server:
        for i in range(8):
            _add(server.config_path, f"Deploy note {i}: deploys need a green build and a review")
        body = _turn("how do deploys work here?")
        body["model"] = "tiny-model"
        for conversation in ("a", "b"):  # the same question in two conversations: two recalls
            headers = {"x-context-budget-session": conversation}
            httpx.post(f"{server.base_url}/chat/completions", json=body, headers=headers)
        first, second = reversed(server.report()["recent"][:2])
        assert first["memory"]["usage"]["exceeded"] is True
        assert "bumped a tier" in second["memory"]["budget"]["complexityReason"]
        out = subprocess.run(
            [
                *(CTXBUDGET, "analyze", "--json", "--min-requests", "1"),
                *("--config", str(server.config_path)),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        result = json.loads(out.stdout)
        assert result["requests"] == 2
        assert {(r["agent"], r["kind"]) for r in result["recommendations"]} >= {("main", "upgrade")}


def test_deep_asks_the_configured_model_for_a_rewrite_once_per_query(
    tmp_path: Path, standin: StandIn
) -> None:
    config = base_config(tmp_path, standin.base_url, enabled=False)
    config["memory"]["rewrite"] = {
        "model": "openai/rewriter",
        "apiBase": standin.base_url,
        "apiKeyEnv": "TEST_REWRITE_KEY",
        # the first rewrite waits for litellm's import (~5 s; far longer on a loaded machine:
        # "litellm is still loading" after the default 5 s), then the stand-in answers at once
        "timeoutSeconds": 120,
    }
    standin.replies["rewriter"] = "therapy counselling appointment"
    with serve(tmp_path, config, env={"TEST_REWRITE_KEY": "sk-rewrite"}) as server:
        _add(server.config_path, "Therapy is on Thursdays at 3pm")
        body = _turn("when is my counselor session")  # no word of the memory

        def ask(profile: str, conversation: str) -> httpx.Response:
            return httpx.post(
                f"{server.base_url}/chat/completions",
                json=body,
                headers={
                    "x-context-budget-profile": profile,
                    # another conversation each time: a resent turn would keep its memories
                    "x-context-budget-session": conversation,
                },
                timeout=60,
            )

        assert ask("balanced", "a").headers["x-context-budget-memories"] == "0"
        assert ask("deep", "b").headers["x-context-budget-memories"] == "1"
        assert ask("deep", "c").headers["x-context-budget-memories"] == "1"  # same words, cached
        rewrites = [r for r in standin.received if r.json.get("model") == "rewriter"]
        assert len(rewrites) == 1, "one rewrite per query, none for balanced"
        asked = rewrites[0]
        assert asked.headers["authorization"] == "Bearer sk-rewrite"
        assert asked.json["messages"][-1] == {
            "role": "user",
            "content": "when is my counselor session",
        }
        upstream = standin.received[-1].json["messages"]
        assert "Therapy is on Thursdays at 3pm" in json.dumps(upstream)
        recent = server.report()["recent"]
        assert recent[0]["memory"]["rewrite"] == "LLM rewrite by openai/rewriter (cached)"
        assert recent[1]["memory"]["rewrite"] == "LLM rewrite by openai/rewriter: 3 words"


def test_a_failing_rewrite_costs_only_the_rewrite(tmp_path: Path, standin: StandIn) -> None:
    config = base_config(tmp_path, standin.base_url, enabled=False)
    config["memory"]["rewrite"] = {
        "model": "openai/rewriter",
        "apiBase": "http://127.0.0.1:9/v1",  # nothing listens there: refused at once
        "timeoutSeconds": 120,  # time for litellm's import, however loaded the machine
    }
    with serve(tmp_path, config) as server:
        _add(server.config_path, "Deploy releases happen on Tuesdays after standup")
        r = httpx.post(
            f"{server.base_url}/chat/completions",
            json=_turn("when is the stand meeting?"),  # deep's prefix matching finds it
            headers={"x-context-budget-profile": "deep"},
            timeout=60,
        )
        assert r.status_code == 200 and r.headers["x-context-budget-memories"] == "1"
        note = server.report()["recent"][0]["memory"]["rewrite"]
        assert note.startswith("LLM rewrite by openai/rewriter failed (")
        assert note.endswith("offline expansion only")
