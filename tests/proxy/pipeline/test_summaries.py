"""Summaries of long tool results (`contextPruning.summarize`) through the app, counted where
they cost: the summary requests the upstream receives. Each result is summarised at most once,
and only after the request that carried it was answered; one owner's failing or slow summaries
leave another's alone; and what they cost is in the report of the owner whose results they
summarised."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from ctxbudget.proxy.errors import UpstreamError
from tests.fakes import FakeReply, FakeUpstream, Sent, chat_completion
from tests.inproc import InProcess, config_for, proxy_app, state_of

OUTPUT = "".join(f"line {i}: " + "ok " * 20 + "\n" for i in range(120))  # ~8.6 KB
SUMMARISER = "gpt-4o-mini"
KEYS = {"CTXBUDGET_PROXY_KEYS": "alice=ka-1,bob=kb-1", "CTXBUDGET_ADMIN_KEY": "adm-1"}


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> None:
        self.now += seconds


Summary = Callable[[str], "bytes | UpstreamError | None"]
"""What the summariser answers for a result's text: the reply's JSON bytes, an error to raise,
or None to never answer (a slow model)."""


def _answer(text: str, *, usage: tuple[int, int] = (2500, 30)) -> bytes:
    return orjson.dumps(
        {
            **chat_completion(text, model=SUMMARISER),
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]},
        }
    )


class Upstream(FakeUpstream):
    """The agent's model answers (or 404s for a model it does not know); the summariser
    answers by `summary`."""

    def __init__(self, summary: Summary) -> None:
        super().__init__()
        self.summary = summary
        self.known = {"gpt-4o"}

    async def request(  # type: ignore[override]
        self,
        method: str,
        url: str,
        *,
        body: bytes | None,
        headers: Mapping[str, str],
        connect_timeout: float,
        read_timeout: float,
    ) -> FakeReply:
        found = orjson.loads(bytes(body or b"{}"))
        if found.get("model") != SUMMARISER:
            if found.get("model") not in self.known:
                self.sent.append(self._sent(method, url, headers, body))
                raise UpstreamError(
                    f"The model `{found.get('model')}` does not exist",
                    status=404,
                    body={"error": {"message": "model not found", "code": "model_not_found"}},
                )
            return await super().request(
                method,
                url,
                body=body,
                headers=headers,
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
            )
        self.sent.append(self._sent(method, url, headers, body))
        said = self.summary(found["messages"][1]["content"])
        if isinstance(said, UpstreamError):
            raise said
        if said is None:
            await asyncio.Event().wait()  # until the app closes
        assert isinstance(said, bytes)
        return FakeReply(200, {"content-type": "application/json"}, [said])

    def _sent(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None) -> Sent:
        return Sent(method, url, dict(headers), body, 0.0, 0.0)


def _chat(turns: int, *, who: str = "", model: str = "gpt-4o") -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are {who or 'a'} coding agent."},
        {"role": "user", "content": "fix the failing test"},
    ]
    for i in range(turns):
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": "exec", "arguments": '{"cmd": "pytest"}'}}  # fmt: skip
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": f"{who}run {i}\n{OUTPUT}"},
        ]
    return {"model": model, "messages": messages}


def _config(tmp_path: Path) -> dict[str, Any]:
    return config_for(
        tmp_path,
        agents={
            "defaults": {
                "contextPruning": {
                    "mode": "cache-ttl",
                    "summarize": {"model": SUMMARISER, "minChars": 1000},
                }
            }
        },
        memory={"inject": {"enabled": False}},
    )


def _asked(fake: FakeUpstream) -> list[str]:
    """The result texts sent to the summariser, in order (their first line)."""
    bodies = [orjson.loads(s.body) for s in fake.sent if s.body]
    return [
        b["messages"][1]["content"].partition("\n")[0]
        for b in bodies
        if b.get("model") == SUMMARISER
    ]


def _settle(client: InProcess, fake: FakeUpstream, *, at_least: int = 0) -> None:
    """Let the background summaries run and be kept; with `at_least`, until that many were
    asked (some of them hang: a slow model), else until none is running."""
    if not at_least:
        client.settle()
        return
    deadline = time.monotonic() + 20
    while len(_asked(fake)) < at_least:
        assert time.monotonic() < deadline, f"{len(_asked(fake))} summaries asked, not {at_least}"
        time.sleep(0.01)
    state_of(client).reports.flush()


def _forwarded(fake: FakeUpstream) -> dict[str, str]:
    """Call id → the tool result text of the agent's last request the upstream got."""
    bodies = [orjson.loads(s.body) for s in fake.sent if s.body]
    last = [b for b in bodies if b.get("model") != SUMMARISER][-1]
    return {m["tool_call_id"]: m["content"] for m in last["messages"] if m.get("role") == "tool"}


def _pruned(text: str) -> bool:
    return "tool result pruned" in text or "content cleared" in text


def _post(client: InProcess, body: dict[str, Any], key: str | None = None) -> Any:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return client.post("/v1/chat/completions", content=orjson.dumps(body), headers=headers)


def test_nothing_is_summarised_for_requests_the_upstream_refused(tmp_path: Path) -> None:
    """The issue's scenario: an agent configured with a model the provider does not know
    retries; every request is answered 404, and none of its results is worth a summary."""
    fake = Upstream(lambda text: _answer("pytest failed in tests/test_io.py"))
    with proxy_app(tmp_path, _config(tmp_path), upstream=fake) as (client, _):
        for _ in range(10):
            r = _post(client, _chat(40, model="gpt-4o-nonexistent"))
            assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        _settle(client, fake)
        assert _asked(fake) == []
        # the same session answered: its results are summarised, each once
        fake.known.add("gpt-4o-nonexistent")
        for _ in range(3):
            assert _post(client, _chat(40, model="gpt-4o-nonexistent")).status_code == 200
            _settle(client, fake)
        asked = _asked(fake)
        assert len(asked) == len(set(asked)) and len(asked) >= 4


def test_an_empty_summary_is_not_asked_for_again(tmp_path: Path) -> None:
    fake = Upstream(lambda text: _answer("  \n"))
    clock = Clock()
    with proxy_app(tmp_path, _config(tmp_path), upstream=fake, clock=clock) as (client, _):
        for turns in range(4, 10):
            assert _post(client, _chat(turns)).status_code == 200
            _settle(client, fake)
            clock.wait(10)
        asked = _asked(fake)
        assert sorted(asked) == [f"run {i}" for i in range(6)]  # each prunable result once
        clock.wait(600)  # the cache expired: pruned, the placeholder stands in
        assert _post(client, _chat(10)).status_code == 200
        _settle(client, fake)
        results = _forwarded(fake)
        assert all(_pruned(results[f"call_{i}"]) for i in range(7))
        assert not any("Summary of" in t for t in results.values())
        assert sorted(_asked(fake)) == [f"run {i}" for i in range(7)]


def test_a_summary_that_the_database_would_refuse_is_kept_once(tmp_path: Path) -> None:
    """A lone surrogate (JSON's `\\ud800`) and a NUL in the summariser's answer: it was paid
    for, so it is kept (each as U+FFFD), counted in the report, and not asked for again."""
    raw = (
        b'{"id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o-mini",'
        b' "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant",'
        b' "content": "pytest failed: \\ud800 in tests/test_io.py\\u0000 at line 40"}}],'
        b' "usage": {"prompt_tokens": 2500, "completion_tokens": 30}}'
    )
    fake = Upstream(lambda text: raw)
    clock = Clock()
    with proxy_app(tmp_path, _config(tmp_path), upstream=fake, clock=clock) as (client, _):
        for turns in range(4, 8):
            assert _post(client, _chat(turns)).status_code == 200
            _settle(client, fake)
            clock.wait(120)  # past any cooldown: nothing failed that a wait would mend
        assert sorted(_asked(fake)) == [f"run {i}" for i in range(4)]
        clock.wait(600)
        assert _post(client, _chat(8)).status_code == 200
        results = _forwarded(fake)
        for i in range(4):
            assert results[f"call_{i}"].startswith(
                f"[Summary of an earlier tool result (exec call_{i},"
            )
            assert results[f"call_{i}"].endswith(
                "pytest failed: \ufffd in tests/test_io.py\ufffd at line 40"
            )
        _settle(client, fake)
        report = client.get("/context/budget").json()
    summaries = [r for r in report["recent"] if r["route"] == "summarize"]
    assert len(summaries) == 5  # call_4, prunable from the last request on, asked too
    assert all(r["costUsd"] > 0 for r in summaries)
    assert report["totals"]["summaries"]["requests"] == 5
    spent = report["totals"]["summaries"]["costUsd"]
    assert abs(spent - sum(r["costUsd"] for r in summaries)) < 1e-12


def test_one_owners_failing_summaries_leave_anothers_alone(tmp_path: Path) -> None:
    def summary(text: str) -> bytes | UpstreamError:
        if text.startswith("alice"):
            return UpstreamError("overloaded", status=529)
        return _answer("pytest failed in tests/test_io.py")

    fake = Upstream(summary)
    clock = Clock()
    config = _config(tmp_path)
    with proxy_app(tmp_path, config, upstream=fake, clock=clock, env=KEYS) as (client, _):
        for turns in (5, 6, 7):
            assert _post(client, _chat(turns, who="alice"), "ka-1").status_code == 200
            _settle(client, fake)
        # asked together, all failed: alice's cooldown (60 s) keeps her call_3 waiting
        assert sorted(_asked(fake)) == ["alicerun 0", "alicerun 1", "alicerun 2"]
        for turns in (5, 6):
            assert _post(client, _chat(turns, who="bob"), "kb-1").status_code == 200
            _settle(client, fake)
        assert sorted(_asked(fake)[3:]) == ["bobrun 0", "bobrun 1", "bobrun 2"]
        clock.wait(61)  # alice's cooldown is over: her new results are asked, the failed not
        assert _post(client, _chat(8, who="alice"), "ka-1").status_code == 200
        _settle(client, fake)
        assert sorted(_asked(fake)[6:]) == ["alicerun 3", "alicerun 4"]
        state_of(client).reports.flush()
        mine = client.get("/context/budget", headers={"authorization": "Bearer ka-1"}).json()
    assert mine["totals"]["summaries"]["requests"] == mine["totals"]["summaries"]["failed"] == 5
    assert {r["status"] for r in mine["recent"] if r["route"] == "summarize"} == {529}


def test_one_owners_slow_summaries_leave_anothers_slots_free(tmp_path: Path) -> None:
    def summary(text: str) -> bytes | None:
        return None if text.startswith("alice") else _answer("pytest failed")

    fake = Upstream(summary)
    with proxy_app(tmp_path, _config(tmp_path), upstream=fake, env=KEYS) as (client, _):
        for turns in (9, 10):
            assert _post(client, _chat(turns, who="alice"), "ka-1").status_code == 200
        _settle(client, fake, at_least=4)
        assert len(_asked(fake)) == 4  # alice's four slots, all waiting on her slow model
        for turns in (5, 6):
            assert _post(client, _chat(turns, who="bob"), "kb-1").status_code == 200
        _settle(client, fake, at_least=7)
        assert sorted(_asked(fake)[4:]) == ["bobrun 0", "bobrun 1", "bobrun 2"]


def test_each_owner_sees_what_its_own_summaries_cost(tmp_path: Path) -> None:
    def summary(text: str) -> bytes:
        big = text.startswith("alice")
        return _answer("pytest failed", usage=(3000, 40) if big else (1000, 10))

    fake = Upstream(summary)
    with proxy_app(tmp_path, _config(tmp_path), upstream=fake, env=KEYS) as (client, _):
        for turns in (5, 6):
            assert _post(client, _chat(turns, who="alice"), "ka-1").status_code == 200
            _settle(client, fake)
        assert _post(client, _chat(5, who="bob"), "kb-1").status_code == 200
        assert _post(client, _chat(6, who="bob"), "kb-1").status_code == 200
        _settle(client, fake, at_least=6)
        reports = {
            key: client.get("/context/budget", headers={"authorization": f"Bearer {key}"}).json()
            for key in ("ka-1", "kb-1", "adm-1")
        }
        text = client.get(
            "/context/budget?format=text", headers={"authorization": "Bearer kb-1"}
        ).text
    alice, bob, admin = (reports[k]["totals"]["summaries"] for k in ("ka-1", "kb-1", "adm-1"))
    assert alice["requests"] == 3 and bob["requests"] == 3
    assert alice["usage"] == {"input": 9000, "output": 120}
    assert bob["usage"] == {"input": 3000, "output": 30}
    assert 0 < bob["costUsd"] < alice["costUsd"]
    assert admin["requests"] == 6
    assert (
        "Summaries (contextPruning.summarize): 3 requests, 3,000 input and 30 output tokens, "
        f"${bob['costUsd']:.6f} (a cost ctxbudget adds, counted above)"
    ) in text
    assert abs(admin["costUsd"] - alice["costUsd"] - bob["costUsd"]) < 1e-12
    # each owner's summaries are in its own sessions' money, no one else's
    for key in ("ka-1", "kb-1"):
        recent = [r for r in reports[key]["recent"] if r["route"] == "summarize"]
        assert len(recent) == 3
        assert {r["owner"] for r in recent} == {"alice" if key == "ka-1" else "bob"}


def _messages(turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "fix the failing test"}]}
    ]
    for i in range(turns):
        use = {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"cmd": "pytest"}}
        result = {
            "type": "tool_result",
            "tool_use_id": f"toolu_{i}",
            "content": f"run {i}\n{OUTPUT}",
        }
        messages += [
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
        ]
    return {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": messages}


def test_summaries_leave_the_sessions_format_model_and_last_request_alone(tmp_path: Path) -> None:
    """A summary is counted in its session's money, but it is not a request of the agent's:
    the session stays an Anthropic one of the agent's model, last seen when the agent was
    (pruning's cold/warm rule on other workers reads that time)."""
    clock = Clock()

    def summary(text: str) -> bytes:
        clock.wait(30)  # each summary answers half a minute after it was asked
        return _answer("pytest failed")

    fake = Upstream(summary)
    fake.known.add("claude-sonnet-4-5")
    fake.answer_json(
        {
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
            "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 2000, "output_tokens": 5},
        }
    )  # fmt: skip
    with proxy_app(tmp_path, _config(tmp_path), upstream=fake, clock=clock) as (client, _):
        for turns in (5, 6):
            last = clock.now
            r = client.post("/v1/messages", content=orjson.dumps(_messages(turns)))
            assert r.status_code == 200, r.text
            _settle(client, fake)
        report = client.get("/context/budget").json()
    assert sorted(_asked(fake)) == ["run 0", "run 1", "run 2"]
    (session,) = report["sessions"]
    assert (session["format"], session["model"]) == ("messages", "claude-sonnet-4-5")
    assert session["last"] == datetime.fromtimestamp(last, UTC).isoformat().replace("+00:00", "Z")
    assert session["requests"] == 2 + 3  # the summaries are counted in its money
    spent = report["totals"]["summaries"]["costUsd"]
    assert session["costUsd"] > spent > 0
