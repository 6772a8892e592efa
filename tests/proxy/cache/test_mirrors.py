"""The session cache mirrors (`proxy/cache/mirrors.py`): a growing conversation is mirrored by
what it adds, the bill is the one a mirror fed from scratch gives, and another key holder
cannot make them slow or push out another owner's (round 36)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ctxbudget.proxy.cache.mirrors as mirrors_module
from ctxbudget.proxy.cache.blocks import Block
from ctxbudget.proxy.cache.mirror import MirrorBlock, OpenAIMirror
from ctxbudget.proxy.cache.mirrors import Mirrors, MirrorView
from ctxbudget.proxy.cache.resent import RESENT, ChangedInPlace
from ctxbudget.proxy.pipeline import relay
from tests.fakes import anthropic_message, chat_completion
from tests.inproc import config_for, proxy_app, state_of
from tests.openclaw import INTERNAL_CONTEXT, tool_call

EPHEMERAL = {"type": "ephemeral"}
MESSAGES_HEADERS = {"anthropic-version": "2023-06-01", "x-context-budget-session": "grow"}
CHAT_HEADERS = {"x-context-budget-session": "grow"}


def _result(turn: int) -> str:
    return "\n".join(f"line {i} of the output of step {turn}" for i in range(60))


def messages_requests(turns: int) -> list[dict[str, Any]]:
    """An OpenClaw Messages tool loop, one request a turn: the system prompt's breakpoint, the
    last tool's, and the newest `tool_result`'s, which moves every turn (the block before it
    changes), then the internal context message the next request drops."""
    history: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "Go."}]}]
    tools = [{"name": f"tool_{i}", "input_schema": {"type": "object"}} for i in range(3)]
    tools[-1] = {**tools[-1], "cache_control": EPHEMERAL}
    out = []
    for turn in range(turns):
        tool_id = f"toolu_{turn:03d}"
        history.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"Step {turn}."},
                    {"type": "tool_use", "id": tool_id, "name": "tool_0", "input": {"n": turn}},
                ],
            }
        )
        history.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": tool_id, "content": _result(turn)}
                ],
            }
        )
        messages = list(history)
        last = messages[-1]
        messages[-1] = {**last, "content": [{**last["content"][0], "cache_control": EPHEMERAL}]}
        internal = {"role": "user", "content": [{"type": "text", "text": INTERNAL_CONTEXT}]}
        out.append(
            {
                "model": "claude-sonnet-4-5",
                "max_tokens": 1024,
                "system": [
                    {"type": "text", "text": "You are OpenClaw. " * 400, "cache_control": EPHEMERAL}
                ],
                "tools": tools,
                "messages": [*messages, internal],
            }
        )
    return out


def chat_requests(turns: int) -> list[dict[str, Any]]:
    """An OpenClaw chat completions tool loop, one request a turn."""
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are OpenClaw. " * 400},
        {"role": "user", "content": "Go."},
    ]
    out = []
    for turn in range(turns):
        call_id = f"call_{turn:03d}"
        history.append(tool_call(call_id, "exec", {"command": f"step {turn}"}))
        history.append({"role": "tool", "tool_call_id": call_id, "content": _result(turn)})
        internal = {"role": "user", "content": [{"type": "text", "text": INTERNAL_CONTEXT}]}
        out.append({"model": "gpt-4o", "messages": [*history, internal]})
    return out


def _counting(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Count the calls of `mirrors.<name>` (the serialising of one block for the mirror)."""
    calls = [0]
    original: Callable[..., Any] = getattr(mirrors_module, name)

    def counted(*args: Any) -> Any:
        calls[0] += 1
        return original(*args)

    monkeypatch.setattr(mirrors_module, name, counted)
    return calls


@pytest.mark.parametrize(
    ("route", "build", "headers", "serialise"),
    [
        ("/v1/messages", messages_requests, MESSAGES_HEADERS, "_bytes"),
        ("/v1/chat/completions", chat_requests, CHAT_HEADERS, "_data"),
    ],
)
def test_a_growing_conversation_is_mirrored_by_what_each_request_adds(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    route: str,
    build: Callable[[int], list[dict[str, Any]]],
    headers: dict[str, str],
    serialise: str,
) -> None:
    # request N+1 is request N and a turn: the mirror serialised every block of the history
    # again on each request (O(turns) a request); now only the blocks that are new or changed
    monkeypatch.setattr(RESENT, "check", False)  # as in production: no whole re-check
    calls = _counting(monkeypatch, serialise)
    bodies = build(40)
    with proxy_app(tmp_path) as (client, fake):
        done = []
        for body in bodies:
            calls[0] = 0
            fake.answer_json({"usage": {}} if route == "/v1/chat/completions" else _anthropic())
            raw = json.dumps(body).encode()
            r = client.post(
                route, content=raw, headers={"content-type": "application/json", **headers}
            )
            assert r.status_code == 200, r.text
            done.append(calls[0])
        assert state_of(client).mirrors.paused(None, "grow") is None  # mirrored, not paused
    assert done[0] > 0  # the first request: every block
    # both copies (as sent and as forwarded): the new turn's two messages, the moved marker's
    # message and the one before it, the internal context; never the 80 before them
    assert max(done[5:]) <= 2 * 8, done


def _anthropic() -> dict[str, Any]:
    return anthropic_message(output_tokens=1)


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_reusing_the_previous_requests_blocks_bills_as_a_mirror_fed_from_scratch(
    provider: Any,
) -> None:
    kept, fresh = Mirrors(), Mirrors()
    build = messages_requests if provider == "anthropic" else chat_requests
    tools = b'[{"name":"t","cache_control":{"type":"ephemeral"}}]'
    for turn, body in enumerate(build(30)):
        # the tools as each body's own slice (equal bytes, another object each time)
        blocks = [Block("tools", memoryview(bytearray(tools)), memoryview(bytearray(tools)))]
        blocks += [Block(f"messages[{i}]", m, m) for i, m in enumerate(body["messages"])]
        now = 10.0 * turn
        a = kept.observe("o", "s", provider, blocks, now=now, model="claude-sonnet-4-5")
        started = fresh.get("o", "s")
        if started is not None:
            started.last = None  # nothing reused: every block serialised and hashed again
        b = fresh.observe("o", "s", provider, blocks, now=now, model="claude-sonnet-4-5")
        assert a is not None and b is not None
        assert (a.sent, a.direct) == (b.sent, b.direct)


def _lines_run(call: Callable[[], Any]) -> tuple[Any, int]:
    """`call()`, and the Python lines it ran: the work counted, not timed (a loop over the
    history runs a line a block; a copy or a comparison of a list runs one)."""
    lines = [0]

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            lines[0] += 1
        return trace

    before = sys.gettrace()
    sys.settrace(trace)
    try:
        return call(), lines[0]
    finally:
        sys.settrace(before)


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_a_requests_mirror_work_does_not_grow_with_the_conversation(
    provider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # request N+1 is request N and a turn: billing it walked every block, every entry held and
    # every 128-token prefix of the history (~2,000 at turn 300) in both copies, and the
    # report priced every block again; now what the turn added, the breakpoints, and the
    # prefixes looked at
    monkeypatch.setattr(RESENT, "check", False)  # as in production: no whole re-check
    mirrors = Mirrors()
    build = messages_requests if provider == "anthropic" else chat_requests
    model = "claude-sonnet-4-5" if provider == "anthropic" else "gpt-4o"
    tools = b'[{"name":"t","cache_control":{"type":"ephemeral"}}]'
    work = []
    for turn, body in enumerate(build(300)):
        blocks = [Block("tools", memoryview(bytearray(tools)), memoryview(bytearray(tools)))]
        blocks += [Block(f"messages[{i}]", m, m) for i, m in enumerate(body["messages"])]

        def request(blocks: list[Block] = blocks, now: float = 10.0 * turn) -> MirrorView | None:
            view = mirrors.observe("o", "s", provider, blocks, now=now, model=model)
            if view is not None:  # the answer: the provider's own count sets the scale
                total = view.sent.total + 7
                view.settle(view.sent.read, total)
                view.exact({1: (40, 40)}, total)  # the report prices it
            return view

        view, lines = _lines_run(request)
        assert view is not None
        work.append(lines)
    # the same two messages a turn from turn 40 to turn 300: the same work, give or take
    assert max(work[290:]) <= 1.25 * max(work[30:40]), (work[30:40], work[290:])


def test_an_expired_openai_prefix_is_never_read_before_it_is_swept() -> None:
    mirror = OpenAIMirror()
    prompt = [MirrorBlock(b"a", 2000), MirrorBlock(b"b", 10)]
    other = [MirrorBlock(b"c", 2000), MirrorBlock(b"d", 10)]
    assert mirror.bill(prompt, now=0.0).read == 0
    assert mirror.bill(other, now=250.0).read == 0  # swept here; the next sweep a minute on
    # `prompt`'s prefixes expired at 300 s (5 minutes unused), not yet swept at 305 s
    assert mirror.bill(prompt, now=305.0).read == 0
    assert mirror.bill(prompt, now=306.0).read == 1920


def _request(n: int) -> list[Block]:
    message = {"role": "user", "content": f"hello {n}"}
    return [Block("messages[0]", message, message)]


def test_reading_whether_a_session_is_paused_never_walks_every_owners_mirrors() -> None:
    # The report asks for each session it shows (20) whether its warm pruning is paused: each
    # question walked every mirror of every owner, and one key's new session ids make up to
    # 131,072 (64 MB of 512-byte mirrors): 0.4 s per report read, on the event loop. The work
    # is counted, not timed: a walk compares the id asked for with every mirror's id.
    compared = [0]

    class SessionId(str):
        """A session id that counts the comparisons made with it (either side of `==`)."""

        def __eq__(self, other: object) -> bool:
            compared[0] += 1
            return str.__eq__(self, other)

        __hash__ = str.__hash__

    mirrors = Mirrors()
    for n in range(2_000):
        mirrors.observe("bob", SessionId(f"s{n}"), "openai", _request(n), now=0.0, model="gpt-4o")
    mirrors.observe("alice", SessionId("mine"), "openai", _request(0), now=0.0, model="gpt-4o")
    assert mirrors.get("bob", "s1999") is not None, "every mirror is kept: a walk meets them all"
    compared[0] = 0
    for n in range(20):
        assert mirrors.paused("alice", f"s{n}") is None  # bob's session of that id: not hers
        assert mirrors.paused(None, f"s{n}") is None
    # by key: a few comparisons a question (a dict lookup's); a walk made 2,001 each
    assert compared[0] <= 40 * 4, compared[0]


def test_one_owners_flood_of_sessions_pushes_out_its_own_mirrors_not_anothers() -> None:
    # One LRU over every owner's mirrors let a key holder's new session ids push out everyone
    # else's: their sessions were mirrored cold again, and a session whose bill had paused
    # its warm pruning (`pruningPaused`) was pruned again. As with the sessions (issue 24),
    # the owner holding the most bytes gives way.
    mirrors = Mirrors(keep_bytes=200_000)
    mirrors.observe("alice", "mine", "openai", _request(0), now=0.0, model="gpt-4o")
    for n in range(2_000):
        mirrors.observe("bob", f"s{n}", "openai", _request(n), now=0.0, model="gpt-4o")
    assert mirrors.get("alice", "mine") is not None
    assert mirrors.get("bob", "s1999") is not None
    assert mirrors.get("bob", "s0") is None  # bob's own oldest went


def test_a_mirror_grown_past_the_whole_bound_is_let_go() -> None:
    # A mirror larger than the bound on its own is not kept; one kept while it was small and
    # grown past the bound by its session's next request stayed, counted at its old weight,
    # and grew on with every request, past the bound it was counted within.
    mirrors = Mirrors(keep_bytes=200_000)
    mirrors.observe("bob", "s", "openai", _request(0), now=0.0, model="gpt-4o")
    assert mirrors.get("bob", "s") is not None
    big = {"role": "user", "content": "x" * 300_000}
    grown = [*_request(0), Block("messages[1]", big, big)]
    mirrors.observe("bob", "s", "openai", grown, now=1.0, model="gpt-4o")
    found = mirrors.get("bob", "s")
    assert found is None or found.weight <= 200_000, found.weight


def _priced_answer(route: str, prompt: int, read: int) -> dict[str, Any]:
    """An answer whose usage says the provider read `read` of `prompt` tokens."""
    if route == "/v1/chat/completions":
        answer = chat_completion(model="gpt-4o")
        answer["usage"] = {
            "prompt_tokens": prompt,
            "completion_tokens": 2,
            "total_tokens": prompt + 2,
            "prompt_tokens_details": {"cached_tokens": read},
        }
        return answer
    answer = _anthropic()
    answer["usage"] = {
        "input_tokens": prompt - read,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": 0,
        "output_tokens": 2,
    }
    return answer


@pytest.mark.parametrize(
    ("route", "build", "headers"),
    [
        ("/v1/messages", messages_requests, MESSAGES_HEADERS),
        ("/v1/chat/completions", chat_requests, CHAT_HEADERS),
    ],
)
def test_pricing_a_request_works_only_the_blocks_it_adds(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    route: str,
    build: Callable[[int], list[dict[str, Any]]],
    headers: dict[str, str],
) -> None:
    """Every tool result clamped: each request moves one block more than the one before. The
    answer is priced on the event loop (`Recorder.finish_priced`): it looked a token count up
    for every block ctxbudget ever moved in the session, as sent and as forwarded, and laid
    each over the mirror's classes, every request (O(turns) a request); now the blocks the
    request adds, the rest carried over from the session's previous request."""
    monkeypatch.setattr(RESENT, "check", False)  # as in production: no whole re-check
    work: list[int] = []
    seen: list[int] = []

    def traced(function: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            found, lines = _lines_run(lambda: function(*args))
            seen.append(lines)
            return found

        return run

    monkeypatch.setattr(relay, "billing", traced(relay.billing))
    monkeypatch.setattr(relay, "billing_is_quick", traced(relay.billing_is_quick))
    budget = {"enabled": True, "toolOutputMaxChars": 900}
    config = config_for(
        tmp_path,
        agents={"defaults": {"contextBudget": budget}},
        memory={"inject": {"enabled": False}},
    )
    read = 0
    with proxy_app(tmp_path, config) as (client, fake):
        for body in build(70):
            raw = json.dumps(body).encode()
            prompt = len(raw) // 4
            fake.answer_json(_priced_answer(route, prompt, read))
            read = prompt // 2 * 2
            seen.clear()
            r = client.post(
                route, content=raw, headers={"content-type": "application/json", **headers}
            )
            assert r.status_code == 200, r.text
            assert "x-context-budget-saved-usd" in r.headers  # priced before it went
            work.append(sum(seen))
        reports = state_of(client).reports
        reports.flush()
        entry = reports.request(r.headers["x-context-budget-request-id"])
    assert entry is not None and len(entry["segments"]) >= 60  # every result clamped
    assert entry["mirrorDrift"] is not None  # priced by the mirror's classes
    # the same one new clamped result a turn at turn 65 as at turn 20: the same work
    assert max(work[62:]) <= 1.25 * max(work[18:24]), (work[18:24], work[62:])


def test_the_resent_check_finds_a_block_changed_in_place_under_the_mirror() -> None:
    """`CTXBUDGET_CHECK_RESENT` (on in the tests): a block the mirror takes from the session's
    previous request by its identity is checked against a whole pass, so a value changed in
    place (which would leave the mirror billing the old bytes) fails loudly."""
    assert RESENT.check
    mirrors = Mirrors()
    body = chat_requests(3)[-1]
    blocks = [Block(f"messages[{i}]", m, m) for i, m in enumerate(body["messages"])]
    assert mirrors.observe("o", "s", "openai", blocks, now=0.0, model="gpt-4o") is not None
    body["messages"][1]["content"] = "changed in place"
    with pytest.raises(ChangedInPlace, match="mirror groups"):
        mirrors.observe("o", "s", "openai", blocks, now=1.0, model="gpt-4o")


def test_an_anthropic_history_is_counted_again_only_when_an_answer_moves_the_scale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # every Anthropic answer sets the session's scale (tokens a byte) from the provider's own
    # count; each moved it a little, and every block of the history was counted again at the
    # new scale on the next request (two copies of ~1,300 blocks at turn 300, O(turns) a
    # request). A scale within `RELAY_SHARE` of the one the blocks are laid at keeps them
    import ctxbudget.proxy.cache.layout as layout_module

    monkeypatch.setattr(RESENT, "check", False)  # as in production: no whole re-check
    scaled = [0]
    original = layout_module.mul

    def mul(a: float, b: int) -> float:
        scaled[0] += 1
        return original(a, b)

    monkeypatch.setattr(layout_module, "mul", mul)
    mirrors = Mirrors()
    tools = b'[{"name":"t","cache_control":{"type":"ephemeral"}}]'
    work, laid = [], []
    for turn, body in enumerate(messages_requests(60)):
        blocks = [Block("tools", memoryview(bytearray(tools)), memoryview(bytearray(tools)))]
        blocks += [Block(f"messages[{i}]", m, m) for i, m in enumerate(body["messages"])]
        scaled[0] = 0
        view = mirrors.observe("o", "s", "anthropic", blocks, now=10.0 * turn, model="m")
        assert view is not None
        work.append(scaled[0])
        laid.append(len(view.session.layouts[0].keys) if view.session.layouts else 0)
        # the provider's count: 0.2% off the mirror's each answer, up and down in turn; one
        # answer at turn 50 says 5% more
        share = 1.05 if turn == 50 else 1.002 if turn % 2 else 0.998
        view.settle(view.sent.read, round(view.sent.total * share))
    # the new turn's blocks and the ones before them it changed, both copies; not the history
    assert max(work[10:51]) <= 2 * 8, work
    # a real move is followed: the next request counts every block again, once
    assert work[51] >= 2 * laid[51] - 8, (work[51], laid[51])
    assert max(work[52:]) <= 2 * 8, work
