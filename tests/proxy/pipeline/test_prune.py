"""The prune stage through the app: when pruning happens (an expired cache; `pays` in a warm
session), that a decision stands for the rest of the conversation (the same bytes, on other
workers and after a restart), and that nothing else of a request changes."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from ctxbudget.caps.prune import pruned_text
from ctxbudget.caps.types import PrunePolicy
from ctxbudget.proxy.report import ledger
from ctxbudget.proxy.report.store import ReportStore
from ctxbudget.proxy.upstream.http import Body
from tests.conftest import Backend
from tests.fakes import REPLIES, FakeUpstream, chat_completion
from tests.inproc import InProcess, config_for, proxy_app, shared_offload, state_of
from tests.prompt_cache import AnthropicCache, OpenAICache, SimClock, price, rates
from tests.standin import _anthropic_blocks

OUTPUT = "".join(f"line {i}: " + "ok " * 20 + "\n" for i in range(120))  # ~8.6 KB


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> None:
        self.now += seconds


def _chat(
    turns: int, *, stamp: str = "[Tue 2026-11-24 09:00 UTC]", run: str = "run"
) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"{stamp} fix the failing test"},
    ]
    for i in range(turns):
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": "exec", "arguments": '{"cmd": "pytest"}'}}  # fmt: skip
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": _output(i, run)},
        ]
    return {"model": "gpt-4o", "messages": messages}


def _output(i: int, run: str = "run") -> str:
    """Call `i`'s result in a run of the task named `run`: another run's output is its own, of
    the same size."""
    return f"{run} {i}\n{OUTPUT if run == 'run' else OUTPUT.replace('ok', run[:2])}"


def _messages(turns: int, *, ttl: str | None = None, long: int = 0) -> dict[str, Any]:
    """An agent's Messages request after `turns` tool calls of ~8.6 KB outputs (`long`: every
    `long`-th ~26 KB, which the caps clamp)."""
    control: dict[str, Any] = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "fix the failing test"}]}
    ]
    for i in range(turns):
        messages += [
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": f"toolu_{i}",
                        "name": "Bash",
                        "input": {"command": "pytest"},
                    }
                ],
            },  # fmt: skip
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": f"toolu_{i}",
                        "content": f"run {i}\n{OUTPUT * (3 if long and i % long == 0 else 1)}",
                    }
                ],
            },  # fmt: skip
        ]
    messages[-1]["content"][-1]["cache_control"] = control
    return {
        "model": "claude-sonnet-4-6",
        "max_tokens": 100,
        "system": [{"type": "text", "text": "You are a coding agent.", "cache_control": control}],
        "messages": messages,
    }


def _responses(turns: int) -> dict[str, Any]:
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": "fix the failing test"}
    ]
    for i in range(turns):
        items += [
            {
                "type": "function_call",
                "call_id": f"fc_{i}",
                "name": "exec_command",
                "arguments": '{"cmd": "pytest"}',
            },  # fmt: skip
            {"type": "function_call_output", "call_id": f"fc_{i}", "output": f"run {i}\n{OUTPUT}"},
        ]
    return {"model": "gpt-4o", "instructions": "You are a coding agent.", "input": items}


def _config(tmp_path: Path, mode: str = "cache-ttl", **pruning: Any) -> dict[str, Any]:
    return config_for(
        tmp_path,
        agents={"defaults": {"contextPruning": {"mode": mode, **pruning}}},
        memory={"inject": {"enabled": False}},
    )


def _send(client: InProcess, fake: FakeUpstream, path: str, body: dict[str, Any]) -> Any:
    fake.answer_json(chat_completion(model=body["model"]))
    r = client.post(path, content=orjson.dumps(body))
    assert r.status_code == 200, r.text
    return r


def _results(fake: FakeUpstream) -> dict[str, str]:
    """Call id → the tool result text the upstream got in the agent's last request (chat;
    a summary asked after it may have gone since)."""
    bodies = [orjson.loads(s.body) for s in fake.sent if s.body]
    sent = [b for b in bodies if b.get("model") != "gpt-4o-mini"][-1]
    return {m["tool_call_id"]: m["content"] for m in sent["messages"] if m.get("role") == "tool"}


def _pruned(text: str) -> bool:
    return "tool result pruned" in text or "content cleared" in text


def test_cache_ttl_prunes_once_the_cache_expired_and_the_bytes_stand(tmp_path: Path) -> None:
    clock = Clock()
    with proxy_app(tmp_path, _config(tmp_path), clock=clock) as (client, fake):
        for turns in range(1, 8):  # a warm tool loop, 10 s a turn: nothing pruned
            _send(client, fake, "/v1/chat/completions", _chat(turns))
            assert not any(_pruned(t) for t in _results(fake).values())
            clock.wait(10)
        clock.wait(600)  # an idle gap: the cache has expired anyway
        r = _send(client, fake, "/v1/chat/completions", _chat(8))
        first = _results(fake)
        # results older than the newest 3 assistant turns are pruned; the newest are not
        assert [i for i, t in first.items() if _pruned(t)] == [f"call_{i}" for i in range(5)]
        assert first["call_5"] == f"run 5\n{OUTPUT}"
        assert "x-context-budget-cache-bust" not in r.headers  # a cold cache: no planned bust
        forwarded = orjson.loads(fake.last.body)["messages"]
        for turns in (9, 10):  # warm again: the decisions stand, no new prune
            clock.wait(10)
            _send(client, fake, "/v1/chat/completions", _chat(turns))
            later = _results(fake)
            assert {i: later[i] for i in first} == first
            assert [i for i, t in later.items() if _pruned(t)] == [f"call_{i}" for i in range(5)]
            # the cached prefix holds: every message the earlier request sent, byte for byte
            sent = orjson.loads(fake.last.body)["messages"]
            assert sent[: len(forwarded) - 1] == forwarded[:-1]
        state_of(client).reports.flush()
        entry = client.get("/context/budget").json()["recent"][2]
        notes = {s["callId"]: s["note"] for s in entry["segments"] if s["kind"] == "pruned"}
        assert notes == {f"call_{i}": "pruned now" for i in range(5)}


def test_pays_prunes_a_long_warm_session_and_says_it_planned_the_bust(tmp_path: Path) -> None:
    sim = SimClock()
    clock = Clock()
    busts = []
    # billed as Anthropic bills, every third output long enough for the caps: a warm prune is
    # taken out of what the session has saved against direct
    upstream = BilledUpstream(sim)
    config = _config(tmp_path, "pays")
    with proxy_app(tmp_path, config, upstream=upstream, clock=clock) as (client, fake):
        for turns in range(1, 40):
            r = client.post("/v1/messages", content=orjson.dumps(_messages(turns, long=3)))
            assert r.status_code == 200, r.text
            sent = orjson.loads(fake.last.body)
            pruned = [
                b["tool_use_id"]
                for m in sent["messages"]
                for b in m["content"]
                if b.get("type") == "tool_result" and _pruned(str(b["content"]))
            ]
            busts.append((turns, bool(pruned), r.headers.get("x-context-budget-cache-bust")))
            clock.wait(5)
            sim.advance(5)
        state_of(client).reports.flush()
        report = client.get("/context/budget").json()
        text = client.get("/context/budget?format=text").text
    first = next(t for t, pruned, _ in busts if pruned)
    assert first > 4  # a short run never pays for a rewrite
    assert "prune" in (next(b for t, _, b in busts if t == first) or "")
    assert all(pruned for t, pruned, _ in busts if t >= first)  # and the decision stands
    (session,) = report["sessions"]
    planned = sum(1 for _, _, b in busts if b and b.endswith(" prune"))
    assert session["cacheBusts"]["planned"] == planned >= 1
    assert session["prunes"] >= first - 3  # the results older than the newest 3 turns
    assert "planned cache bust" in text


def test_cache_ttl_leaves_a_warm_session_alone_however_long(tmp_path: Path) -> None:
    # the pruned form of the oldest result, as the policy writes it: what a prune would send
    pruned = pruned_text(f"run 0\n{OUTPUT}", "Bash", "toolu_0", PrunePolicy())
    assert pruned is not None
    clock = Clock()
    with proxy_app(tmp_path, _config(tmp_path), clock=clock) as (client, fake):
        for turns in range(1, 30):
            _send(client, fake, "/v1/messages", _messages(turns))
            clock.wait(60)  # under the 5-minute lifetime: always warm
            sent = orjson.loads(fake.last.body)
            assert _result_text(sent, "toolu_0") == f"run 0\n{OUTPUT}"
        clock.wait(301)  # then a cold gap: the same results are pruned, in that form
        _send(client, fake, "/v1/messages", _messages(30))
        assert _result_text(orjson.loads(fake.last.body), "toolu_0") == pruned


def _result_text(body: dict[str, Any], call_id: str) -> str:
    """The text of the Messages tool result for `call_id` in `body`."""
    for message in body["messages"]:
        for block in message["content"]:
            if block.get("type") == "tool_result" and block["tool_use_id"] == call_id:
                content = block["content"]
                return content if isinstance(content, str) else content[0]["text"]
    raise AssertionError(f"no tool result {call_id}")


def test_an_hour_cache_is_not_expired_by_ten_minutes(tmp_path: Path) -> None:
    clock = Clock()
    with proxy_app(tmp_path, _config(tmp_path), clock=clock) as (client, fake):
        for turns in (5, 6):
            _send(client, fake, "/v1/messages", _messages(turns, ttl="1h"))
            clock.wait(600)
        assert b"tool result pruned" not in fake.last.body
        clock.wait(3600)
        _send(client, fake, "/v1/messages", _messages(7, ttl="1h"))
        sent = orjson.loads(fake.last.body)
        assert b"tool result pruned" in fake.last.body
        # ids, pairing and cache_control markers as the client sent them
        client_body = _messages(7, ttl="1h")
        assert len(sent["messages"]) == len(client_body["messages"])
        for old, new in zip(client_body["messages"], sent["messages"], strict=True):
            for a, b in zip(old["content"], new["content"], strict=True):
                assert {k: v for k, v in a.items() if k != "content"} == {
                    k: v for k, v in b.items() if k != "content"
                }
        assert sent["system"] == client_body["system"]


def test_responses_results_are_pruned_the_same_way(tmp_path: Path) -> None:
    clock = Clock()
    with proxy_app(tmp_path, _config(tmp_path), clock=clock) as (client, fake):
        _send(client, fake, "/v1/responses", _responses(5))
        clock.wait(600)
        _send(client, fake, "/v1/responses", _responses(6))
        sent = orjson.loads(fake.last.body)
        outputs = {i["call_id"]: i["output"] for i in sent["input"] if "output" in i}
        assert [c for c, o in outputs.items() if _pruned(o)] == ["fc_0", "fc_1", "fc_2"]
        assert sent["instructions"] == "You are a coding agent."


def test_other_workers_and_a_restart_send_the_same_bytes(tmp_path: Path) -> None:
    clock = Clock()
    config = _config(tmp_path)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    with proxy_app(tmp_path / "a", config, clock=clock) as (a, fake_a):
        _send(a, fake_a, "/v1/chat/completions", _chat(6))
        clock.wait(600)
        _send(a, fake_a, "/v1/chat/completions", _chat(7))
        pruned = _results(fake_a)
    assert any(_pruned(t) for t in pruned.values())
    # another worker, or the proxy restarted: a new app on the same database that never saw
    # the conversation, while its cache is warm
    clock.wait(10)
    with proxy_app(tmp_path / "b", config, clock=clock) as (b, fake_b):
        _send(b, fake_b, "/v1/chat/completions", _chat(8))
        other = _results(fake_b)
    assert {i: other[i] for i in pruned} == pruned


def test_another_worker_sees_a_prune_as_the_session_seen_with_the_report_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers on one database: a prune after an idle gap is a request of the session,
    whatever the report's writer has written yet. The other worker, which last saw the
    session before the gap, serves the next request warm: it takes no new prune (which would
    bust the cache the prune just wrote, and report "pruned now" again)."""
    clock = Clock()
    config = _config(tmp_path)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    with (
        proxy_app(tmp_path / "a", config, clock=clock) as (a, fake_a),
        proxy_app(tmp_path / "b", config, clock=clock) as (b, fake_b),
    ):
        for turns in (5, 6):
            _send(b, fake_b, "/v1/chat/completions", _chat(turns))
            clock.wait(10)
        b.settle()
        clock.wait(600)
        # what each worker read of the decisions is as old as the gap (a real second)
        monkeypatch.setattr(ledger, "FRESH_SECONDS", 0.0)
        held: list[Any] = []  # worker a's report writer is behind: its records wait
        monkeypatch.setattr(state_of(a).reports, "add", held.append)
        _send(a, fake_a, "/v1/chat/completions", _chat(7))
        pruned = {i: t for i, t in _results(fake_a).items() if _pruned(t)}
        assert sorted(pruned) == ["call_0", "call_1", "call_2", "call_3"]
        clock.wait(10)
        _send(b, fake_b, "/v1/chat/completions", _chat(8))
        later = _results(fake_b)
        assert {i: later[i] for i in pruned} == pruned
        assert not _pruned(later["call_4"])  # warm: prunable since, but left alone
        monkeypatch.undo()
        for record in held:
            state_of(a).reports.add(record)


def test_a_large_body_is_pruned_as_in_process(tmp_path: Path) -> None:
    out = []
    for offload in (None, shared_offload(0)):
        clock = Clock()
        folder = tmp_path / ("big" if offload else "small")
        folder.mkdir()
        with proxy_app(folder, _config(folder), clock=clock, offload=offload) as (client, fake):
            _send(client, fake, "/v1/messages", _messages(5))
            clock.wait(600)
            _send(client, fake, "/v1/messages", _messages(6))
            out.append(fake.last.body)
    assert out[0] == out[1] and b"tool result pruned" in out[0]


@pytest.mark.parametrize("switch", ["off-budget", "off-mode"])
def test_nothing_is_pruned_with_the_budget_or_pruning_off(tmp_path: Path, switch: str) -> None:
    clock = Clock()
    config = _config(tmp_path, "off" if switch == "off-mode" else "cache-ttl")
    if switch == "off-budget":
        config["agents"]["defaults"]["contextBudget"]["enabled"] = False
    with proxy_app(tmp_path, config, clock=clock) as (client, fake):
        _send(client, fake, "/v1/chat/completions", _chat(6))
        clock.wait(3600)
        _send(client, fake, "/v1/chat/completions", _chat(7))
        assert not any(_pruned(t) for t in _results(fake).values())


def _summaries_asked(fake: FakeUpstream) -> list[dict[str, Any]]:
    bodies = [orjson.loads(s.body) for s in fake.sent if s.body]
    return [b for b in bodies if b.get("model") == "gpt-4o-mini"]


def test_a_summary_stands_for_a_long_result_once_pruned(tmp_path: Path) -> None:
    clock = Clock()
    config = _config(tmp_path, summarize={"model": "gpt-4o-mini", "minChars": 1000})
    answer = {
        **chat_completion("pytest failed twice in tests/test_io.py: EOFError at line 40"),
        "usage": {"prompt_tokens": 2500, "completion_tokens": 30},
    }
    with proxy_app(tmp_path, config, clock=clock) as (client, fake):
        for turns in range(1, 7):
            fake.answer_json(answer)
            client.post("/v1/chat/completions", content=orjson.dumps(_chat(turns)))
            clock.wait(10)
        # the results that became prunable were sent to the summariser, off the request path
        client.settle()  # and the summaries are kept
        asked = _summaries_asked(fake)
        assert len(asked) == 3 and "run 0" in asked[0]["messages"][1]["content"]
        clock.wait(600)
        fake.answer_json(answer)
        client.post("/v1/chat/completions", content=orjson.dumps(_chat(7)))
        sent = [orjson.loads(s.body) for s in fake.sent if s.body]
        results = {
            m["tool_call_id"]: m["content"]
            for m in [b for b in sent if b["model"] == "gpt-4o"][-1]["messages"]
            if m.get("role") == "tool"
        }
        for i in range(3):
            assert results[f"call_{i}"].startswith(
                f"[Summary of an earlier tool result (exec call_{i}, 8,"
            )
            assert results[f"call_{i}"].endswith("EOFError at line 40")
        assert _pruned(results["call_3"])  # no summary asked for it yet: the placeholder
        # call_3's summary is asked once this answer is done, in the background: its record
        # is queued only when that ends (flushing the writer alone could come before it)
        client.settle()
        report = client.get("/context/budget").json()
    summaries = [r for r in report["recent"] if r["route"] == "summarize"]
    assert len(summaries) == 4  # call_3, prunable from the last request on, asked too
    assert all(r["costUsd"] > 0 for r in summaries)
    assert all(r["withoutCtxbudgetUsd"] == 0 for r in summaries)  # all cost, nothing saved


def test_a_failed_summary_leaves_the_placeholder(tmp_path: Path) -> None:
    clock = Clock()
    config = _config(tmp_path, summarize={"model": "gpt-4o-mini", "minChars": 1000})
    with proxy_app(tmp_path, config, clock=clock) as (client, fake):
        for turns in range(1, 6):
            _send(client, fake, "/v1/chat/completions", _chat(turns))
            fake.answer_json({"error": {"message": "overloaded"}}, status=529)
            client.settle()
            clock.wait(10)
        clock.wait(600)
        _send(client, fake, "/v1/chat/completions", _chat(6))
        pruned = [t for t in _results(fake).values() if _pruned(t)]
        assert pruned and not any("Summary of" in t for t in pruned)


@pytest.mark.parametrize("odd", ["\ud800", "\x00"], ids=["surrogate", "nul"])
def test_a_result_with_text_no_database_takes_is_pruned_and_stands(
    tmp_path: Path, backend: Backend, odd: str
) -> None:
    """Issue 35, item 3: a lone surrogate (JSON's `\\ud800`; binary tool output) in a pruned
    result's head or call id was a 500 `UnicodeEncodeError` when the decision was stored, a
    NUL a 500 `DataError` on PostgreSQL, again each time the session went cold. The decision
    is stored and read back as it was: another worker sends the very same bytes."""
    clock = Clock()
    config = _config(tmp_path)
    if backend.url is not None:
        config["database"] = {"url": backend.url}

    def body(turns: int) -> bytes:
        found = _chat(turns)
        for m in found["messages"]:
            for call in m.get("tool_calls") or ():
                call["id"] = call["id"].replace("call_0", f"call_0{odd}")
            if m.get("tool_call_id") == "call_0":
                m["tool_call_id"] = f"call_0{odd}"
                m["content"] = f"bin {odd}{odd}\n{m['content']}"
        return json.dumps(found).encode()  # escapes as a client's JSON does: \ud800, \u0000

    def results(fake: FakeUpstream) -> dict[str, str]:
        sent = json.loads(fake.last.body)
        return {m["tool_call_id"]: m["content"] for m in sent["messages"] if m["role"] == "tool"}

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    with proxy_app(tmp_path / "a", config, clock=clock) as (a, fake_a):
        for turns, wait in ((5, 600), (6, 10)):
            fake_a.answer_json(chat_completion(model="gpt-4o"))
            r = a.post("/v1/chat/completions", content=body(turns))
            assert r.status_code == 200, r.text
            clock.wait(wait)
        pruned = results(fake_a)
        assert _pruned(pruned[f"call_0{odd}"]) and pruned[f"call_0{odd}"].startswith(f"bin {odd}")
    with proxy_app(tmp_path / "b", config, clock=clock) as (b, fake_b):  # another worker
        fake_b.answer_json(chat_completion(model="gpt-4o"))
        r = b.post("/v1/chat/completions", content=body(7))
        assert r.status_code == 200, r.text
        assert results(fake_b)[f"call_0{odd}"] == pruned[f"call_0{odd}"]


def test_decisions_and_summaries_are_capped_per_owner(tmp_path: Path) -> None:
    """Issue 35, item 8: `pruned` and `summaries` grew without a per-key limit (8,002 rows
    and 25 MB of tool text from one key in minutes, kept 90 days). Each owner keeps its
    newest decisions and summaries, and one key's flood never pushes out another's."""
    clock = Clock()
    config = _config(tmp_path)
    config["proxy"]["keysEnv"] = "KEYS"
    env = {"KEYS": "alice=ka-1,mallory=km-2"}
    reports = ReportStore(tmp_path / "report.db", run="t", keep_decisions=6)
    try:
        with proxy_app(tmp_path, config, env=env, clock=clock, reports=reports) as (client, fake):

            def session(key: str, stamp: str) -> None:
                for turns in (5, 6):  # the second, after an idle gap, prunes call_0-call_2
                    fake.answer_json(chat_completion(model="gpt-4o"))
                    body = orjson.dumps(_chat(turns, stamp=stamp))
                    headers = {"authorization": f"Bearer {key}"}
                    r = client.post("/v1/chat/completions", content=body, headers=headers)
                    assert r.status_code == 200, r.text
                    clock.wait(600)

            session("ka-1", "[Mon 2026-11-23 08:00 UTC]")
            for hour in range(10, 15):  # five conversations, fifteen decisions
                session("km-2", f"[Tue 2026-11-24 {hour}:00 UTC]")
            assert b"tool result pruned" in fake.last.body
        for n in range(10):
            reports.ledger.add_summary("mallory", f"c{n}", "call_0", "short", at=clock.now + n)
        reports.ledger.add_summary("alice", "c0", "call_0", "short", at=clock.now)
        db = reports.ledger._db  # noqa: SLF001 - the rows at rest are what the cap is about
        rows = dict(db.fetchall("SELECT owner, count(*) FROM pruned GROUP BY owner"))
        assert rows == {"alice": 3, "mallory": 6}
        newest = db.fetchall("SELECT max(at) FROM pruned WHERE owner = 'mallory'")[0][0]
        assert newest == clock.now - 600, "the newest conversation's decisions are kept"
        summaries = dict(db.fetchall("SELECT owner, count(*) FROM summaries GROUP BY owner"))
        assert summaries == {"alice": 1, "mallory": 6}
    finally:
        reports.close()


# --- `pays` priced on the session's cache mirror (issue 31 items 2 and 3) -------------------

SYSTEM = "".join(
    f"Rule {i}: " + "keep the workspace tidy and say what you ran. " * 4 + "\n" for i in range(120)
)  # fmt: skip  ~25 KB, as OpenClaw's prompt and tools


class BilledUpstream(FakeUpstream):
    """Answers Messages requests with the usage the billing stand-in (`tests/prompt_cache.py`,
    written apart from the mirror) bills them, and keeps the bill."""

    def __init__(self, clock: SimClock) -> None:
        super().__init__()
        self.cache = AnthropicCache(clock)
        self.usd = 0.0

    async def request(self, method: str, url: str, *, body: Body | None, **kw: Any) -> Any:
        data = orjson.loads(bytes(body or b"{}"))
        usage = self.cache.bill(data["model"], _anthropic_blocks(data))
        found = rates(data["model"], "anthropic")
        assert found is not None
        self.usd += price(found, usage, 5)
        self.answer_json({
            **REPLIES["/v1/messages"],
            "model": data["model"],
            "usage": {
                "input_tokens": usage.input, "output_tokens": 5,
                "cache_read_input_tokens": usage.cache_read,
                "cache_creation_input_tokens": usage.cache_write_5m + usage.cache_write_1h,
                "cache_creation": {"ephemeral_5m_input_tokens": usage.cache_write_5m,
                                   "ephemeral_1h_input_tokens": usage.cache_write_1h},
            },
        })  # fmt: skip
        return await super().request(method, url, body=body, **kw)


def _direct_usd(bodies: list[dict[str, Any]], gaps: list[float]) -> float:
    """What the client's own requests are billed sent straight to the stand-in."""
    clock = SimClock()
    cache, usd = AnthropicCache(clock), 0.0
    for body, gap in zip(bodies, gaps, strict=True):
        found = rates(body["model"], "anthropic")
        assert found is not None
        usd += price(found, cache.bill(body["model"], _anthropic_blocks(body)), 5)
        clock.advance(gap)
    return usd


def _agent(turns: int, ttl: str = "1h", *, big: int = 24) -> dict[str, Any]:
    """An OpenClaw-shaped Messages request after `turns` tool calls: a long system prompt and
    the newest block marked, results of 24-30 KB every other turn (1 KB between)."""
    control = {"type": "ephemeral", "ttl": ttl}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "fix the failing test"}]}
    ]
    for i in range(turns):
        size = big + i % 7 if i % 2 == 0 else 1  # KB: a long output, then a short one
        text = f"run {i}\n" + "".join(f"{i}.{j}: " + "x" * 90 + "\n" for j in range(size * 10))
        use = {"type": "tool_use", "id": f"toolu_{i}", "name": "exec", "input": {"n": i}}
        result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": text}
        messages += [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
    messages[-1]["content"][-1]["cache_control"] = control
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        "system": [{"type": "text", "text": SYSTEM, "cache_control": control}],
        "messages": messages,
    }


def _claude_code(turns: int, *, every: int = 3, big: int = 24) -> dict[str, Any]:
    """`_agent` as Claude Code sends it: a new prompt every `every` turns, marked as a block
    list while it is the newest message, then resent as a plain string once a tool call
    follows it (the entry written at its breakpoint is never read again)."""
    body = _agent(turns, big=big)
    control = body["messages"][-1]["content"][-1].pop("cache_control")
    messages: list[dict[str, Any]] = []
    for i, message in enumerate(body["messages"]):
        messages.append(message)
        turn = (i - 1) // 2  # the tool call answered in message i (a user message)
        if i % 2 == 0 and i > 0 and turn % every == every - 1:
            prompt = f"now check step {turn}"
            reply = {"type": "text", "text": f"done with step {turn}"}
            messages += [{"role": "assistant", "content": [reply]},
                         {"role": "user", "content": prompt}]  # fmt: skip
    last = messages[-1]
    if isinstance(last["content"], str):  # the newest prompt: a block list, marked
        last["content"] = [{"type": "text", "text": last["content"]}]
    last["content"][-1]["cache_control"] = control
    return {**body, "model": "claude-opus-4-6", "messages": messages}


def _pruned_ids(body: bytes) -> set[str]:
    sent = orjson.loads(body)
    return {
        b["tool_use_id"]
        for m in sent["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result" and _pruned(str(b["content"]))
    }


def _run(
    tmp_path: Path,
    gaps: list[float],
    *,
    big: int = 24,
    paused: list[Any] | None = None,
    agent: Callable[[int], dict[str, Any]] | None = None,
) -> tuple[BilledUpstream, list[set[str]], Any, float]:
    """The agent's session through the app under `pays`, a request after each of `gaps`
    (seconds): the upstream, the results pruned in each request, the report, the direct bill
    (`paused`: gets each request's `pruningPaused` from the report after it; `agent`: the
    request after a number of turns, else `_agent`'s)."""
    sim = SimClock()
    upstream = BilledUpstream(sim)
    bodies = [agent(t) if agent else _agent(t, big=big) for t in range(1, len(gaps) + 1)]
    pruned: list[set[str]] = []
    with proxy_app(
        tmp_path, _config(tmp_path, "pays"), upstream=upstream, clock=lambda: 1.8e9 + sim.now()
    ) as (client, _):
        for body, gap in zip(bodies, gaps, strict=True):
            r = client.post("/v1/messages", content=orjson.dumps(body))
            assert r.status_code == 200, r.text
            pruned.append(_pruned_ids(upstream.last.body or b"{}"))
            if paused is not None:
                (now,) = client.get("/context/budget").json()["sessions"]
                paused.append(now.get("pruningPaused"))
            sim.advance(gap)
        state_of(client).reports.flush()
        report = client.get("/context/budget").json()
    return upstream, pruned, report, _direct_usd(bodies, gaps)


def test_pays_on_an_hour_cache_that_never_goes_cold_costs_no_more_than_direct(
    tmp_path: Path,
) -> None:
    upstream, pruned, report, direct = _run(tmp_path, [60.0] * 40)
    assert upstream.usd <= direct, (upstream.usd, direct)
    # pruned in batches that repay a whole rewrite: never on two turns in a row
    new = [i for i in range(1, len(pruned)) if pruned[i] - pruned[i - 1]]
    assert new, "a batch that repays its rewrite is pruned"
    assert all(b - a > 1 for a, b in zip(new, new[1:], strict=False)), new
    (session,) = report["sessions"]
    assert session["costUsd"] == pytest.approx(upstream.usd, rel=1e-9)
    # the counterfactual is the direct mirror's: the client's own bill, within 2%
    assert session["withoutCtxbudgetUsd"] == pytest.approx(direct, rel=0.02), (
        session["withoutCtxbudgetUsd"], direct)  # fmt: skip


def test_pays_on_claude_codes_hour_cache_costs_no_more_than_direct(tmp_path: Path) -> None:
    # Claude Code resends a marked prompt as a plain string: a prune on a prompt's request is
    # written where nothing reads it, and the next request writes the history again (issue
    # 31: 6.0% above direct on the recorded session kept warm an hour)
    agent = functools.partial(_claude_code, big=6)  # results a prune barely repays once
    upstream, _, report, direct = _run(tmp_path, [60.0] * 40, agent=agent)
    assert upstream.usd <= direct, (upstream.usd, direct)
    (session,) = report["sessions"]
    assert session["costUsd"] == pytest.approx(upstream.usd, rel=1e-9)


def test_pays_prunes_everything_due_after_a_cold_gap(tmp_path: Path) -> None:
    gaps = [60.0] * 12 + [3700.0] + [60.0] * 12
    _, pruned, report, direct = _run(tmp_path, gaps)
    # the request after the hour's gap: every result older than the newest 3 turns
    assert pruned[13] == {f"toolu_{i}" for i in range(0, 14 - 3, 2)}
    # the direct mirror's counterfactual reads the whole history where the prune wrote it:
    # each block at its own tokens, the client's bill within 2% (it was 5% above)
    (session,) = report["sessions"]
    assert session["withoutCtxbudgetUsd"] == pytest.approx(direct, rel=0.02), (
        session["withoutCtxbudgetUsd"], direct)  # fmt: skip


def test_a_session_with_nothing_saved_takes_no_warm_prune(tmp_path: Path) -> None:
    # results under every clamp: nothing is saved before a prune, and a warm prune's rewrite
    # is paid at once, repaid only if the session goes on; taken only out of what the
    # session has saved against direct, it is never taken here (it put the session above
    # direct for several requests)
    paused: list[Any] = []
    upstream, pruned, _, direct = _run(tmp_path, [60.0] * 40, big=9, paused=paused)
    assert not any(pruned), [i for i, p in enumerate(pruned) if p]
    assert paused == [None] * 40
    assert upstream.usd <= direct, (upstream.usd, direct)


def _own(fake: FakeUpstream, run: str, turns: int, pruned: range) -> None:
    """The agent's last request went upstream with each result of run `run` as its own: the
    results of `pruned` in the policy's pruned form of that very result, the rest whole."""
    policy = PrunePolicy()
    expected = {
        f"call_{i}": (pruned_text(_output(i, run), "exec", f"call_{i}", policy) or "")
        if i in pruned
        else _output(i, run)
        for i in range(turns)
    }
    assert _results(fake) == expected


def test_two_runs_of_one_task_never_get_each_others_results(
    tmp_path: Path, backend: Backend
) -> None:
    """Issue 31, item 5: two conversations of one key with the same system prompt, the same
    first message and the same call ids (`call_0`…, as local models number their calls) got
    each other's pruned text, even for the newest result. Each gets only its own."""
    clock = Clock()
    config = _config(tmp_path)
    if backend.url is not None:
        config["database"] = {"url": backend.url}
    with proxy_app(tmp_path, config, clock=clock) as (client, fake):

        def send(turns: int, run: str) -> None:
            _send(client, fake, "/v1/chat/completions", _chat(turns, run=run))

        for turns in range(1, 7):  # run "first", warm
            send(turns, "first")
            clock.wait(10)
        clock.wait(600)  # cold: its four oldest results are pruned
        send(7, "first")
        _own(fake, "first", 7, range(4))
        for turns in range(1, 8):  # the same task again, warm: its results go whole
            clock.wait(10)
            send(turns, "second")
            _own(fake, "second", turns, range(0))
        clock.wait(600)  # cold: its own five oldest pruned, in its own texts
        send(8, "second")
        _own(fake, "second", 8, range(5))
        clock.wait(10)  # and each run's decisions stand for it alone, byte for byte
        send(8, "first")
        _own(fake, "first", 8, range(4))
        clock.wait(10)
        send(9, "second")
        _own(fake, "second", 9, range(5))


def test_a_decision_lands_only_on_the_result_it_was_taken_for(tmp_path: Path) -> None:
    """A result whose text is not the one a decision was taken for (the client edited its
    history, or another run reuses the call id) goes as it is while the cache is warm, and is
    pruned anew, in its own text, once it expires."""
    clock = Clock()

    def body(turns: int, edited: bool) -> dict[str, Any]:
        found = _chat(turns)
        if edited:
            for m in found["messages"]:
                if m.get("tool_call_id") == "call_2":
                    m["content"] = _output(2, "edited")
        return found

    with proxy_app(tmp_path, _config(tmp_path), clock=clock) as (client, fake):
        _send(client, fake, "/v1/chat/completions", body(6, False))
        clock.wait(600)
        _send(client, fake, "/v1/chat/completions", body(7, False))
        _own(fake, "run", 7, range(4))
        clock.wait(10)
        _send(client, fake, "/v1/chat/completions", body(8, True))
        results = _results(fake)
        assert results["call_2"] == _output(2, "edited")  # not run 2's pruned text
        policy = PrunePolicy()
        for i in (0, 1, 3):  # the others' decisions stand
            assert results[f"call_{i}"] == pruned_text(_output(i), "exec", f"call_{i}", policy)
        clock.wait(600)
        _send(client, fake, "/v1/chat/completions", body(9, True))
        results = _results(fake)
        edited = pruned_text(_output(2, "edited"), "exec", "call_2", policy)
        assert results["call_2"] == edited
        assert results["call_0"] == pruned_text(_output(0), "exec", "call_0", policy)


def _old_report_db(tmp_path: Path, backend: Backend, conversation: str, at: float) -> None:
    """The report's database at schema 7 (before decisions had digests), as `tmp_path`'s
    config finds it, with a decision for `conversation`'s `call_0` (another run's)."""
    from ctxbudget.memory.pg import PgDatabase, migrate
    from ctxbudget.memory.sqlite import Database
    from ctxbudget.proxy.report.store import MIGRATIONS

    old = [m for m in MIGRATIONS if m.version <= 7]
    insert = (
        "INSERT INTO pruned (owner, conversation, call_id, text, at) "
        "VALUES ('default', ?, 'call_0', 'another run of the task', ?)"
    )
    if backend.url is not None:
        pg = PgDatabase(backend.url, pool_size=1)
        try:
            migrate(pg, "report", old)
            with pg.transaction() as tx:
                tx.execute(insert, (conversation, at))
        finally:
            pg.close()
        return
    db = Database(tmp_path / "report.db")
    try:
        with db.transaction() as conn:
            for step in old:
                for statement in (step.sqlite or "").split(";"):
                    if statement.strip():
                        conn.execute(statement)
            conn.execute("PRAGMA user_version=7")
            conn.execute(insert, (conversation, at))
    finally:
        db.close()


def _legacy_conversation(body: dict[str, Any]) -> str:
    """The conversation id schema 7's decisions were filed under: the session and the first
    message."""
    from ctxbudget.proxy.cache.prefix import ClientPrefix
    from ctxbudget.proxy.cache.sessions import session_key
    from ctxbudget.proxy.wire.chat import ChatCompletions

    parsed = ChatCompletions().parse(orjson.dumps(body))
    prefix = ClientPrefix(parsed.blocks(), "default")
    session = session_key({}, parsed.get, parsed.model, prefix)
    return prefix.conversation(session)


def test_decisions_without_a_digest_from_before_are_never_applied(
    tmp_path: Path, backend: Backend
) -> None:
    """Schema 8 binds each decision to its result's digest. A database from before opens
    and works; its decisions carry no digest, so nothing proves which result each was taken
    for (two runs of one task shared their conversation id): they are not applied, and the
    conversation's results are pruned anew when its cache next expires."""
    clock = Clock()
    _old_report_db(tmp_path, backend, _legacy_conversation(_chat(5)), clock.now)
    config = _config(tmp_path)
    if backend.url is not None:
        config["database"] = {"url": backend.url}
    with proxy_app(tmp_path, config, clock=clock) as (client, fake):
        ledger = state_of(client).reports.ledger
        _send(client, fake, "/v1/chat/completions", _chat(5))
        _own(fake, "run", 5, range(0))
        clock.wait(600)
        _send(client, fake, "/v1/chat/completions", _chat(6))
        _own(fake, "run", 6, range(3))
        clock.wait(10)
        _send(client, fake, "/v1/chat/completions", _chat(7))
        _own(fake, "run", 7, range(3))
        rows = ledger._db.fetchall(  # noqa: SLF001 - the rows at rest
            "SELECT call_id, length(digest) FROM pruned ORDER BY call_id"
        )
    assert rows == [("call_0", 0), ("call_0", 32), ("call_1", 32), ("call_2", 32)]


class BilledChatUpstream(FakeUpstream):
    """Answers chat completions with the usage the billing stand-in's OpenAI cache bills them
    (`tests/prompt_cache.py`), and keeps the bill."""

    def __init__(self, clock: SimClock) -> None:
        super().__init__()
        self.cache = OpenAICache(clock)
        self.usd = 0.0

    async def request(self, method: str, url: str, *, body: Body | None, **kw: Any) -> Any:
        data = orjson.loads(bytes(body or b"{}"))
        usage = _chat_usage(self.cache, data)
        found = rates(data["model"], "openai")
        assert found is not None
        self.usd += price(found, usage, 5)
        answer = chat_completion(model=data["model"])
        answer["usage"] = {
            "prompt_tokens": usage.input + usage.cache_read, "completion_tokens": 5,
            "total_tokens": usage.input + usage.cache_read + 5,
            "prompt_tokens_details": {"cached_tokens": usage.cache_read},
        }  # fmt: skip
        self.answer_json(answer)
        return await super().request(method, url, body=body, **kw)


def _chat_usage(cache: OpenAICache, data: dict[str, Any]) -> Any:
    parts = [("message", m) for m in data.get("messages") or []]
    return cache.bill(parts, retention=data.get("prompt_cache_retention"))


def test_the_counterfactual_of_a_pruned_openai_session_is_its_direct_bill(
    tmp_path: Path,
) -> None:
    # the direct mirror's counterfactual on OpenAI's cache, through the app: the client's bill
    sim = SimClock()
    upstream = BilledChatUpstream(sim)
    gaps = [60.0] * 12 + [400.0] + [60.0] * 12
    bodies = []
    for t in range(1, len(gaps) + 1):
        body = _agent(t)
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        for m in body["messages"]:
            for b in m["content"]:
                if b["type"] == "text":
                    messages.append({"role": "user", "content": b["text"]})
                elif b["type"] == "tool_use":
                    arguments = json.dumps(b["input"])
                    call = {"id": b["id"], "type": "function",
                            "function": {"name": "exec", "arguments": arguments}}  # fmt: skip
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
                else:
                    messages.append(
                        {"role": "tool", "tool_call_id": b["tool_use_id"], "content": b["content"]}
                    )
        bodies.append({"model": "gpt-4.1", "messages": messages})
    with proxy_app(
        tmp_path, _config(tmp_path, "pays"), upstream=upstream, clock=lambda: 1.8e9 + sim.now()
    ) as (client, _):
        for body, gap in zip(bodies, gaps, strict=True):
            r = client.post("/v1/chat/completions", content=orjson.dumps(body))
            assert r.status_code == 200, r.text
            sim.advance(gap)
        state_of(client).reports.flush()
        report = client.get("/context/budget").json()
    clock = SimClock()
    cache, direct = OpenAICache(clock), 0.0
    for body, gap in zip(bodies, gaps, strict=True):
        found = rates(body["model"], "openai")
        assert found is not None
        direct += price(found, _chat_usage(cache, body), 5)
        clock.advance(gap)
    (session,) = report["sessions"]
    assert upstream.usd < direct
    assert session["costUsd"] == pytest.approx(upstream.usd, rel=1e-9)
    assert session["withoutCtxbudgetUsd"] == pytest.approx(direct, rel=0.02), (
        session["withoutCtxbudgetUsd"], direct)  # fmt: skip
