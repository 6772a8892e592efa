"""Sessions, cache busts and money (issue 11), in-process: which session a request is counted
in, that ctxbudget's own changes keep the cached prefix (and a clamp that does not is caught),
that memory blocks stay where they were placed, and that each key sees its own sessions."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import ctxbudget.proxy.cache.blocks as blocks_module
from ctxbudget.caps import Caps, ClampResult, Memo, ToolNames, clamp_request
from ctxbudget.proxy.cache.blocks import serial
from ctxbudget.proxy.cache.prefix import ClientPrefix
from ctxbudget.proxy.cache.sessions import SessionTracker, session_key
from ctxbudget.proxy.report.billing import Shift, cost, without
from ctxbudget.proxy.report.prices import Prices, prices
from ctxbudget.proxy.report.usage import Usage
from ctxbudget.proxy.wire.chat import ChatCompletions
from tests.fakes import chat_completion
from tests.inproc import config_for, proxy_app, state_of
from tests.openclaw import openclaw_request, tool_call

ROUTE = "/v1/chat/completions"


def _key(body: dict[str, Any], headers: dict[str, str] | None = None) -> str:
    parsed = ChatCompletions().parse(json.dumps(body).encode())
    return session_key(headers or {}, parsed.get, parsed.model, ClientPrefix(parsed.blocks()))


def test_the_session_comes_from_the_client_where_it_says_one() -> None:
    body = {"model": "m", "messages": [{"role": "system", "content": "S"}]}
    assert _key(body, {"x-context-budget-session": "build-42"}) == "build-42"
    assert _key(body, {"x-claude-code-session-id": "0b6c-11"}) == "0b6c-11"
    assert _key(body, {"session-id": "codex-7"}) == "codex-7"  # Codex CLI
    assert _key({**body, "prompt_cache_key": "sess:0"}) == "sess:0"
    user_id = json.dumps({"device_id": "d", "session_id": "cc-5"})
    assert _key({**body, "metadata": {"user_id": user_id}}) == "cc-5"
    assert _key({**body, "metadata": {"user_id": "user_ab_account_cd_session_ef-1"}}) == "ef-1"
    # the explicit header wins over everything the client sends
    both = {**body, "prompt_cache_key": "sess:0"}
    assert _key(both, {"x-context-budget-session": "mine"}) == "mine"
    # an id that could not go in a header or a log line is hashed
    odd = _key(body, {"x-context-budget-session": "a b\x1b[31m"})
    assert odd.startswith("h:") and len(odd) == 18


def test_without_a_session_id_the_stable_prefix_names_the_session() -> None:
    system = "You are an agent.\n<!-- OPENCLAW_CACHE_BOUNDARY -->\n"
    a = {"model": "m", "messages": [{"role": "system", "content": system + "now 10:00"}]}
    b = {"model": "m", "messages": [{"role": "system", "content": system + "now 10:05"}]}
    b["messages"].append({"role": "user", "content": "another turn"})
    assert _key(a) == _key(b), "what follows the cache boundary does not change the session"
    assert _key(a).startswith("prefix:")
    other = {"model": "m", "messages": [{"role": "system", "content": "Another agent."}]}
    assert _key(other) != _key(a)
    assert _key({**a, "model": "m2"}) != _key(a)


_IDS = """
from ctxbudget.proxy.cache.sessions import ClientPrefix, session_key
from ctxbudget.proxy.pipeline.jobs import _digested_blocks
from ctxbudget.proxy.wire.chat import ChatCompletions

def ids(raw):
    body = ChatCompletions().parse(raw)
    found = []
    for blocks in (_digested_blocks(body.blocks(), "o200k_base", "default"), body.blocks()):
        prefix = ClientPrefix(blocks)  # as the offload process hands it over, and as parsed here
        session = session_key({}, body.get, body.model, prefix)
        found.append([session, prefix.conversation(session)])
    return found
"""


def test_session_and_conversation_ids_are_the_same_in_every_process() -> None:
    # Another worker or instance (its own digest seed) files the same conversation's pruning
    # decisions, and counts its session, under the same ids; also for a large body's blocks
    # hashed in the offload process. Before, each process's seed made its own ids. This
    # process is one (its own random seed), a helper with another seed the other: one
    # interpreter started, not two.
    request = openclaw_request(version="9.x", size_bytes=180_000)  # tools over SMALL_BLOCK
    request["messages"].insert(1, {"role": "user", "content": "x" * 70_000})
    for n in range(3):  # the first message is block 5: after the tools and four system ones
        request["messages"].insert(1, {"role": "system", "content": f"rules {n}"})
    raw = json.dumps(request).encode()

    other = blocks_module.SEED ^ 1
    env = {**os.environ, blocks_module.SEED_ENV: str(other)}
    script = f"import json, sys\n{_IDS}\nprint(json.dumps(ids(sys.stdin.buffer.read())))"
    done = subprocess.run(
        [sys.executable, "-c", script], input=raw, env=env, capture_output=True, check=True
    )
    there: list[list[str]] = json.loads(done.stdout)
    here_namespace: dict[str, Any] = {}
    exec(_IDS, here_namespace)
    here: list[list[str]] = here_namespace["ids"](raw)
    assert here == there
    offloaded, in_process = here
    assert in_process == offloaded
    assert in_process[0].startswith("prefix:") and in_process[1].startswith(in_process[0] + "/")


def test_a_cache_marker_is_not_part_of_a_block() -> None:
    marked = {"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}
    assert serial(marked) == serial({"type": "text", "text": "x"})
    assert serial({"cache_control": {"type": "ephemeral"}, "text": "x"}) == b'{"text":"x"}'


def _turns() -> list[dict[str, Any]]:
    """Three requests of one OpenClaw session: a tool loop, then a new user turn."""
    first = openclaw_request(stream=False, model="gpt-4o")
    second = {**first, "messages": [*first["messages"], tool_call("c9", "read", {"p": "a"})]}
    second["messages"].append({"role": "tool", "tool_call_id": "c9", "content": "file a"})
    third = {**second, "messages": [*second["messages"]]}
    third["messages"] += [
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "[Sun 2026-11-22 11:30 UTC] And the zebra deadline?"},
    ]
    return [first, second, third]


def test_deterministic_clamps_and_memories_keep_the_cached_prefix(tmp_path: Path) -> None:
    with proxy_app(tmp_path) as (client, fake):
        fake.answer_json(chat_completion(model="gpt-4o"))
        client.post("/v1/memories", json={"text": "Fetch the page from the staging mirror"})
        client.post("/v1/memories", json={"text": "The zebra deadline is Friday the 28th"})
        replies = [client.post(ROUTE, json=body) for body in _turns()]
        sent = [s.json["messages"] for s in fake.sent]
        state_of(client).reports.flush()
        report = client.get("/context/budget").json()
    assert all(r.status_code == 200 for r in replies)
    assert {r.headers["x-context-budget-session"] for r in replies} == {report["sessions"][0]["id"]}
    assert not [r for r in replies if "x-context-budget-cache-bust" in r.headers]
    # every request forwards the previous one's messages byte for byte, memory block included
    for before, after in itertools.pairwise(sent):
        assert after[: len(before)] == before
    memory_texts = [
        m["content"] for m in sent[-1] if "User context:" in json.dumps(m.get("content"))
    ]
    assert len(memory_texts) == 2, "the first turn's block stayed; the new turn got its own"
    # recall ran once per user turn: the tool loop's second request placed the block again
    counts = [r.headers["x-context-budget-memories"] for r in replies]
    assert counts[0] == counts[1] != "0" and counts[2] != "0", counts
    assert [r["memory"] is not None for r in report["recent"][::-1]] == [True, False, True]
    (session,) = report["sessions"]
    assert session["requests"] == 3
    assert session["cacheBusts"] == {"client": 0, "ctxbudget": 0, "planned": 0}
    assert session["memoryTokens"] > 0


def _unstable_clamp() -> Any:
    """A clamp that is not a pure function of its input: it stamps each call differently."""
    calls = itertools.count()

    def clamp(
        request: dict[str, Any], caps: Caps, *, tools: ToolNames, memo: Memo | None = None
    ) -> ClampResult:
        result = clamp_request(request, caps, tools=tools, memo=memo)
        messages = result.request["messages"]
        system = dict(messages[0])
        system["content"] = f"{system['content']} #{next(calls)}"
        return ClampResult(
            request={**result.request, "messages": [system, *messages[1:]]},
            segments=result.segments,
            changed=True,
        )

    return clamp


def test_a_clamp_that_is_not_deterministic_is_caught_as_a_cache_bust(tmp_path: Path) -> None:
    with proxy_app(tmp_path, clamp=_unstable_clamp()) as (client, fake):
        fake.answer_json(chat_completion(model="gpt-4o"))
        replies = [client.post(ROUTE, json=body) for body in _turns()[:2]]
        state_of(client).reports.flush()
        report = client.get("/context/budget").json()
        metrics = client.get("/metrics").text
    assert "x-context-budget-cache-bust" not in replies[0].headers  # nothing to compare with
    assert replies[1].headers["x-context-budget-cache-bust"] == "messages[0] clamp"
    (session,) = report["sessions"]
    assert session["cacheBusts"] == {"client": 0, "ctxbudget": 1, "planned": 0}
    assert session["lastCacheBust"] == "messages[0] clamp"
    assert report["recent"][0]["cacheBust"] == "messages[0] clamp"
    assert report["totals"]["money"]["cacheBusts"]["ctxbudget"] == 1
    assert 'ctxbudget_cache_busts_total{by="ctxbudget"} 1.0' in metrics


def test_a_client_that_rewrites_its_history_busts_its_own_cache(tmp_path: Path) -> None:
    first, second, _ = _turns()
    edited = json.loads(json.dumps(second))
    edited["messages"][1]["content"] += " (edited)"
    with proxy_app(tmp_path) as (client, fake):
        fake.answer_json(chat_completion(model="gpt-4o"))
        for body in (first, second, edited):
            r = client.post(ROUTE, json=body)
            assert "x-context-budget-cache-bust" not in r.headers
        state_of(client).reports.flush()
        (session,) = client.get("/context/budget").json()["sessions"]
    assert session["cacheBusts"] == {"client": 1, "ctxbudget": 0, "planned": 0}


def test_money_is_the_providers_usage_at_the_models_prices(tmp_path: Path) -> None:
    usage = {
        "prompt_tokens": 50_000,
        "completion_tokens": 300,
        "prompt_tokens_details": {"cached_tokens": 40_000},
    }
    with proxy_app(tmp_path) as (client, fake):
        fake.answer_json({**chat_completion(model="gpt-4o"), "usage": usage})
        for body in _turns()[:2]:
            client.post(ROUTE, json=body)
        fake.answer_json({**chat_completion(model="gpt-4o"), "usage": None})
        client.post(ROUTE, json=_turns()[2])  # a reply without usage is counted, not billed
        state_of(client).reports.flush()
        report = client.get("/context/budget").json()
    (session,) = report["sessions"]
    p = prices("gpt-4o")
    assert p is not None
    one = 10_000 * p.input + 40_000 * p.cache_read + 300 * p.output
    assert session["requests"] == 3 and session["billedRequests"] == 2
    assert session["usage"] == {
        "input": 20_000,
        "cacheRead": 80_000,
        "cacheWrite": 0,
        "output": 600,
    }
    assert session["costUsd"] == pytest.approx(2 * one)
    # the provider read 80% of each prompt from its cache: clamps in that part saved reads,
    # clamps after it full-price input (`proxy/report/record.py` `_read_blocks`)
    first, second = report["recent"][:0:-1]
    assert first["withoutUsage"]["input"] > 10_000 and first["withoutUsage"]["cacheRead"] > 40_000
    assert second["withoutUsage"]["cacheRead"] > 40_000
    assert session["savedUsd"] == pytest.approx(session["withoutCtxbudgetUsd"] - session["costUsd"])
    assert session["savedUsd"] > 0
    assert report["totals"]["money"]["costUsd"] == pytest.approx(2 * one)


def test_an_unpriced_model_reports_tokens_and_says_money_is_unknown(tmp_path: Path) -> None:
    with proxy_app(tmp_path) as (client, fake):
        fake.answer_json(chat_completion(model="no-such-model"))
        body = {**_turns()[0], "model": "no-such-model"}
        client.post(ROUTE, json=body)
        state_of(client).reports.flush()
        report = client.get("/context/budget").json()
        text = client.get("/context/budget?format=text").text
    (session,) = report["sessions"]
    assert session["usage"]["input"] == 10 and session["costUsd"] is None
    assert session["savedUsd"] is None
    assert report["totals"]["money"]["unpricedSessions"] == 1
    assert "price unknown" in text


def test_each_key_sees_only_its_own_sessions(tmp_path: Path) -> None:
    env = {"KEYS": "alice=ka-1,bob=kb-2", "ADMIN": "adm-1"}
    config = config_for(tmp_path, proxy={"keysEnv": "KEYS", "adminKeyEnv": "ADMIN"})
    with proxy_app(tmp_path, config, env=env) as (client, fake):
        fake.answer_json(chat_completion(model="gpt-4o"))
        for key, session in (("ka-1", "alice-1"), ("kb-2", "bob-1")):
            headers = {"authorization": f"Bearer {key}", "x-context-budget-session": session}
            assert client.post(ROUTE, json=_turns()[0], headers=headers).status_code == 200
        state_of(client).reports.flush()

        def seen(key: str) -> list[str]:
            r = client.get("/context/budget", headers={"authorization": f"Bearer {key}"})
            return [s["id"] for s in r.json()["sessions"]]

        assert seen("ka-1") == ["alice-1"]
        assert seen("kb-2") == ["bob-1"]
        assert sorted(seen("adm-1")) == ["alice-1", "bob-1"]


def test_the_same_session_id_under_two_keys_is_two_sessions() -> None:
    tracker = SessionTracker()
    body = ChatCompletions().parse(
        b'{"model": "m", "messages": [{"role": "user", "content": "a"}]}'
    )
    prefix = ClientPrefix(body.blocks())
    assert tracker.observe("alice", "s", prefix, body.blocks()).first
    assert tracker.observe("bob", "s", prefix, body.blocks()).first
    assert not tracker.observe("alice", "s", prefix, body.blocks()).first


def test_without_moves_a_busts_tokens_back_to_cache_reads() -> None:
    used = Usage(input=9_000, cache_read=1_000, cache_write=0, output=10)
    # ctxbudget changed block 1 (500 → 400 tokens) so the 8,000 tokens after it were billed
    # again; without ctxbudget all of it would have been read from the cache
    shifts = [
        Shift(client=500, forwarded=400, client_cached=True, forwarded_cached=False),
        Shift(client=8_000, forwarded=8_000, client_cached=True, forwarded_cached=False),
    ]
    assert without(used, shifts) == Usage(input=600, cache_read=9_500, cache_write=0, output=10)
    p = Prices(input=2e-6, output=8e-6, cache_read=0.5e-6, cache_write=2e-6)
    assert cost(without(used, shifts), p) < cost(used, p), "the bust cost more than it saved"


def test_without_a_cache_read_nothing_was_cached_either_way() -> None:
    used = Usage(input=900, cache_read=0, cache_write=0, output=1)
    shift = Shift(client=300, forwarded=100, client_cached=True, forwarded_cached=True)
    assert without(used, [shift]) == Usage(input=1_100, cache_read=0, cache_write=0, output=1)
    written = Usage(input=10, cache_read=0, cache_write=900, output=1)
    assert without(written, [shift]).cache_write == 1_100, "new blocks are billed as writes"


def test_text_page_and_chat_command_say_the_net_saving(tmp_path: Path) -> None:
    with proxy_app(tmp_path) as (client, fake):
        fake.answer_json(chat_completion(model="gpt-4o"))
        for body in _turns()[:2]:
            client.post(ROUTE, json=body)
        state_of(client).reports.flush()
        report = client.get("/context/budget").json()
        text = client.get("/context/budget?format=text").text
        page = client.get("/context/budget?format=html").text
        ask = {"model": "gpt-4o", "messages": [{"role": "user", "content": "/context budget"}]}
        command = client.post(ROUTE, json=ask).json()["choices"][0]["message"]["content"]
    money = report["totals"]["money"]
    assert money["savedUsd"] > 0
    headline = f"saved ${money['savedUsd']:,.6f} net of cache effects over 1 session"
    assert headline in text and headline in command
    assert "cache busts caused by ctxbudget: 0" in text
    (session,) = report["sessions"]
    assert session["id"] in text
    # the page: a cost bar per session, and the figures the JSON has
    assert "id='sessions-chart'" in page and "id='cache-line'" in page
    for path, value in (
        ("sessions.0.costUsd", session["costUsd"]),
        ("sessions.0.withoutCtxbudgetUsd", session["withoutCtxbudgetUsd"]),
        ("totals.money.cacheHitRatio", money["cacheHitRatio"]),
    ):
        assert f"data-figure='{path}' data-value='{value}'" in page


def _request(*texts: str) -> ClientPrefix:
    body = {"model": "m", "messages": [{"role": "user", "content": t} for t in texts]}
    return ClientPrefix(ChatCompletions().parse(json.dumps(body).encode()).blocks())


def test_the_tracker_counts_the_shared_prefix_and_forgets_the_oldest_session() -> None:
    tracker = SessionTracker(keep=2)
    first = _request("a", "b", "c", "d", "e")
    tracker.observe("o", "s1", first, first.blocks)
    later = _request("a", "b", "c", "x", "e", "f")
    change = tracker.observe("o", "s1", later, later.blocks)
    assert (change.shared_client, change.shared_forwarded) == (3, 3)
    assert change.client_cache_bust and change.bust is None  # the client edited block 3
    for session in ("s2", "s3"):  # two more sessions push s1 out
        tracker.observe("o", session, first, first.blocks)
    assert tracker.observe("o", "s1", later, later.blocks).first


def test_a_new_question_gets_its_own_recall_when_the_client_moves_its_last_message(
    tmp_path: Path,
) -> None:
    """OpenClaw re-appends its internal-context message after every turn: the memory block
    placed there is not in the cached prefix, so each new question is recalled afresh."""
    context = {"role": "user", "content": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nx\n<<<END>>>"}
    system = {"role": "system", "content": "You are an agent."}
    ask = {"role": "user", "content": "[Sun 2026-11-22 11:28 UTC] when is the zebra deadline?"}
    call = tool_call("c1", "read", {"p": "a"})
    result = {"role": "tool", "tool_call_id": "c1", "content": "file a"}
    again = {"role": "user", "content": "[Sun 2026-11-22 11:30 UTC] and where is the zoo?"}
    turns = [
        [system, ask, context],
        [system, ask, call, result, context],
        [system, ask, call, result, {"role": "assistant", "content": "Friday."}, again, context],
    ]
    with proxy_app(tmp_path) as (client, fake):
        fake.answer_json(chat_completion(model="gpt-4o"))
        client.post("/v1/memories", json={"text": "The zebra deadline is Friday the 28th"})
        client.post("/v1/memories", json={"text": "The zoo is on Harbour Street"})
        for messages in turns:
            r = client.post(ROUTE, json={"model": "gpt-4o", "messages": messages})
            assert "x-context-budget-cache-bust" not in r.headers
        sent = [s.json["messages"][-1]["content"] for s in fake.sent]
    assert "zebra deadline" in sent[0] and "zebra deadline" in sent[1]
    assert "Harbour Street" in sent[2], "the new question was recalled for"


def test_one_owners_flood_of_sessions_pushes_out_only_its_own() -> None:
    # one LRU for every owner let any key holder evict everyone's sessions (issue 24)
    tracker = SessionTracker()
    first = _request("a", "b")
    tracker.observe("alice", "hers", first, first.blocks)
    for i in range(5_000):
        tracker.observe("mallory", f"flood{i}", first, first.blocks)
    assert not tracker.observe("alice", "hers", first, first.blocks).first
    assert tracker.observe("mallory", "flood0", first, first.blocks).first  # its own went


def test_past_the_total_the_owner_with_the_most_sessions_gives_way() -> None:
    tracker = SessionTracker(keep=4, keep_total=6)
    one = _request("a")
    for owner, count in (("a", 1), ("b", 2), ("c", 3)):
        for i in range(count):
            tracker.observe(owner, f"{owner}{i}", one, one.blocks)
    tracker.observe("a", "a1", one, one.blocks)  # 7 in all: c, with the most, loses c0
    kept = [tracker.observe(o, s, one, one.blocks).first for o, s in _OWNED]
    assert kept == [False] * len(_OWNED)
    assert tracker.observe("c", "c0", one, one.blocks).first


_OWNED = [("a", "a0"), ("a", "a1"), ("b", "b0"), ("b", "b1"), ("c", "c1"), ("c", "c2")]


def test_a_resent_block_is_found_by_the_bytes_the_client_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An agent resends its history every turn: the session stage hashes what the client sent
    # and serialises only blocks it has not seen, with the same bytes and digests either way.
    import ctxbudget.proxy.cache.prefix as prefixes

    body = openclaw_request(version="9.x", size_bytes=60_000)
    body["messages"][1]["content"] = [
        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}
    ]
    raw = json.dumps(body, indent=1).encode()  # spaces and newlines: not how serial writes
    parsed = ChatCompletions().parse(raw)
    blocks = parsed.blocks()
    assert all(b.sent is not None for b in blocks if b.label.startswith("messages["))
    serialised = ClientPrefix([prefixes.Block(b.label, b.client, b.forwarded) for b in blocks])
    calls = 0
    real = prefixes.serial

    def counted(value: Any) -> bytes:
        nonlocal calls
        data = real(value)
        # the tools are passed on as sent; blocks under 1 KB are cheap and not kept
        calls += not isinstance(value, bytes) and len(data) >= prefixes.SERIAL_ITEM_BYTES[0]
        return data

    monkeypatch.setattr(prefixes, "serial", counted)
    owner = "found-by-sent-bytes"  # an owner of its own: nothing kept for it before
    first = ClientPrefix(ChatCompletions().parse(raw, owner=owner).blocks(), owner)
    large = calls
    assert large >= 3
    again = ClientPrefix(ChatCompletions().parse(raw, owner=owner).blocks(), owner)
    assert calls == large  # every large message found by its bytes
    for prefix in (first, again):
        assert prefix.data == serialised.data and prefix.digests == serialised.digests
    # the marker moved to another message: new bytes, serialised again, same digest as before
    body["messages"][1]["content"][0].pop("cache_control")
    moved_raw = json.dumps(body, indent=1).encode()
    moved = ClientPrefix(ChatCompletions().parse(moved_raw, owner=owner).blocks(), owner)
    assert moved.digests == first.digests
