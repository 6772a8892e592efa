"""`pays` on a Claude Code-shaped session (issue 31, items 2 and 3), through the app, the
answers streamed as Claude Code gets them and billed as Anthropic bills them: never billed
above direct wherever the session ends, and the same session replayed decides the same,
whenever the report's writer gets to its records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from ctxbudget.proxy.report import RequestRecord
from ctxbudget.proxy.report.store import ReportStore
from ctxbudget.proxy.upstream.http import Body
from tests.fakes import FakeUpstream
from tests.inproc import config_for, proxy_app, state_of
from tests.prompt_cache import AnthropicCache, SimClock, price, rates
from tests.proxy.pipeline.test_prune import _agent
from tests.standin import _anthropic_blocks, _event

MODEL = "claude-opus-4-6"
SYSTEM = "".join(
    f"Rule {i}: " + "read before you edit, run the tests, say what you ran. " * 4 + "\n"
    for i in range(120)
)  # fmt: skip  ~28 KB, as Claude Code's system prompt and tools
RESULT = "".join(f"{j:4}\t    value = parse_number(text, at={j}) or 0\n" for j in range(220))
"""~10 KB: a file read, as Claude Code's Read and Bash results are."""


class StreamedBilledUpstream(FakeUpstream):
    """Answers Messages requests as a stream whose usage the billing stand-in
    (`tests/prompt_cache.py`, written apart from the mirror) bills, and keeps each bill."""

    def __init__(self, clock: SimClock) -> None:
        super().__init__()
        self.cache = AnthropicCache(clock)
        self.bills: list[float] = []

    async def request(self, method: str, url: str, *, body: Body | None, **kw: Any) -> Any:
        data = orjson.loads(bytes(body or b"{}"))
        usage = self.cache.bill(data["model"], _anthropic_blocks(data))
        found = rates(data["model"], "anthropic")
        assert found is not None
        self.bills.append(price(found, usage, 5))
        billed = {
            "input_tokens": usage.input,
            "output_tokens": 1,
            "cache_read_input_tokens": usage.cache_read,
            "cache_creation_input_tokens": usage.cache_write_5m + usage.cache_write_1h,
            "cache_creation": {
                "ephemeral_5m_input_tokens": usage.cache_write_5m,
                "ephemeral_1h_input_tokens": usage.cache_write_1h,
            },
        }
        message = {"id": "msg_1", "type": "message", "role": "assistant", "model": data["model"],
                   "content": [], "stop_reason": None, "usage": billed}  # fmt: skip
        block = {"type": "content_block_start", "index": 0,
                 "content_block": {"type": "text", "text": ""}}  # fmt: skip
        self.answer_sse([
            _event("message_start", {"type": "message_start", "message": message}),
            _event("content_block_start", block),
            _event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                           "delta": {"type": "text_delta", "text": "ok"}}),
            _event("content_block_stop", {"type": "content_block_stop", "index": 0}),
            _event("message_delta", {"type": "message_delta",
                                     "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                     "usage": {"output_tokens": 5}}),
            _event("message_stop", {"type": "message_stop"}),
        ])  # fmt: skip
        return await super().request(method, url, body=body, **kw)


def claude_code(requests: int, ttl: str | None = None, *, long: int = 0) -> list[dict[str, Any]]:
    """A Claude Code session of `requests` requests: a new prompt every 2 (the model answers
    it with one tool call, ~10 KB of output, then with text; `long`: every `long`-th output
    ~40 KB, which the caps clamp), each prompt a marked block list
    while it is the newest message and a plain string after; breakpoints on the system's
    blocks and the newest message's last block, at `ttl`."""
    control: dict[str, Any] = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.330;"},
        {"type": "text", "text": "You are Claude Code.", "cache_control": control},
        {"type": "text", "text": SYSTEM, "cache_control": control},
    ]
    history: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>the repo"}]}
    ]
    bodies = []
    prompt = "say how numbers are parsed"
    for i in range(requests):
        if i % 2 == 0:
            newest: dict[str, Any] = {"role": "user", "content": [{"type": "text", "text": prompt}]}
        else:
            history[-1] = {"role": "user", "content": prompt}
            use = {"type": "tool_use", "id": f"toolu_{i:03}", "name": "Bash", "input": {"n": i}}
            said = {"type": "text", "text": "Reading."}
            history.append({"role": "assistant", "content": [said, use]})
            output = f"step {i}\n{RESULT * (4 if long and i // 2 % long == 0 else 1)}"
            newest = {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"toolu_{i:03}", "content": output}
            ]}  # fmt: skip
        marked = json.loads(json.dumps(newest))
        marked["content"][-1]["cache_control"] = control
        bodies.append({"model": MODEL, "max_tokens": 32000, "stream": True, "system": system,
                       "messages": [*history, marked]})  # fmt: skip
        history.append(newest)
        if i % 2 == 1:
            said = {"type": "text", "text": f"Done {i}."}
            history.append({"role": "assistant", "content": [said]})
            prompt = f"now step {i + 1}, the same way"
    return bodies


def openclaw(requests: int, ttl: str = "5m") -> list[dict[str, Any]]:
    """An OpenClaw-shaped Messages session (`test_prune._agent`: the system prompt and the
    newest block marked, a tool call a request, ~24-30 KB outputs every other one), streamed."""
    return [{**_agent(turns, ttl), "stream": True} for turns in range(1, requests + 1)]


def direct_bills(bodies: list[dict[str, Any]], gap: float) -> list[float]:
    """Each request's bill sent straight to the stand-in, `gap` seconds apart."""
    clock = SimClock()
    cache = AnthropicCache(clock)
    out = []
    for body in bodies:
        found = rates(body["model"], "anthropic")
        assert found is not None
        out.append(price(found, cache.bill(body["model"], _anthropic_blocks(body)), 5))
        clock.advance(gap)
    return out


class HeldReports(ReportStore):
    """The report's writer far behind (a busy machine): no record reaches it until the end."""

    held: list[RequestRecord]

    def add(self, record: RequestRecord) -> None:
        self.held = [*getattr(self, "held", []), record]

    def release(self) -> None:
        for record in getattr(self, "held", []):
            super().add(record)
        self.held = []


def replay(
    tmp_path: Path,
    bodies: list[dict[str, Any]],
    gap: float,
    *,
    held: bool = False,
    flushed: bool = False,
) -> tuple[StreamedBilledUpstream, dict[str, Any]]:
    """`bodies` through a fresh app under `pays`, `gap` seconds apart: the upstream (what it
    got, what it billed) and the report. `held`: the report's writer gets no record until the
    end (a busy machine); `flushed`: it has written each before the next request (an idle
    one, an agent that thinks between requests)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    sim = SimClock()
    upstream = StreamedBilledUpstream(sim)
    config = config_for(
        tmp_path,
        agents={"defaults": {"contextPruning": {"mode": "pays"}}},
        memory={"inject": {"enabled": False}},
    )
    reports = HeldReports(tmp_path / "report.db", run="held") if held else None
    try:
        with proxy_app(
            tmp_path, config, upstream=upstream, clock=lambda: 1.8e9 + sim.now(), reports=reports
        ) as (client, _):
            for body in bodies:
                r = client.post("/v1/messages?beta=true", content=orjson.dumps(body))
                assert r.status_code == 200, r.text
                assert b"message_stop" in r.content
                if flushed:
                    state_of(client).reports.flush()
                sim.advance(gap)
            if reports is not None:
                reports.release()
            state_of(client).reports.flush()
            report = client.get("/context/budget").json()
    finally:
        if reports is not None:
            reports.close()
    return upstream, report


def _pruned(upstream: FakeUpstream) -> list[int]:
    """The requests that went upstream with a result pruned."""
    return [
        i
        for i, sent in enumerate(upstream.sent)
        if any(
            b.get("type") == "tool_result"
            and any(m in str(b.get("content")) for m in ("tool result pruned", "content cleared"))
            for m in orjson.loads(sent.body or b"{}")["messages"]
            if isinstance(m["content"], list)
            for b in m["content"]
        )
    ]


@pytest.mark.parametrize("ttl", [None, "1h"], ids=["5m", "1h"])
def test_a_claude_code_session_kept_warm_is_never_billed_above_direct(
    tmp_path: Path, ttl: str | None
) -> None:
    # issue 31: a warm prune taken a few requests before the session ended was never repaid
    # (the horizon, half the run so far, is too long at a session's end): the session ended
    # above direct. Whichever request it ends at, it is at or under direct.
    bodies = claude_code(60, ttl)
    upstream, report = replay(tmp_path, bodies, 60.0)
    direct = direct_bills(bodies, 60.0)
    billed = upstream.bills
    assert len(billed) == len(direct)
    above = [
        (n, round(sum(billed[:n]) / sum(direct[:n]) - 1, 4))
        for n in range(1, len(bodies) + 1)
        if sum(billed[:n]) > sum(direct[:n]) * (1 + 1e-9)
    ]
    assert not above, above
    (session,) = report["sessions"]
    assert session["costUsd"] == pytest.approx(sum(billed), rel=1e-9)


@pytest.mark.parametrize(
    "session",
    [lambda: openclaw(40), lambda: claude_code(60, "1h", long=3)],
    ids=["openclaw-5m", "claude-code-1h"],
)
def test_the_same_session_replayed_decides_the_same_whenever_the_report_is_written(
    tmp_path: Path, session: Any
) -> None:
    # a decision read the measured bill and the mirror (its tokens a byte) as the report's
    # writer thread had settled them: with the writer behind (a busy machine) the OpenClaw
    # session took its first warm prune a request later than with the writer caught up
    bodies = session()
    first, _ = replay(tmp_path / "a", bodies, 60.0, flushed=True)
    second, _ = replay(tmp_path / "b", bodies, 60.0, held=True)
    assert _pruned(first), "a warm prune is taken: the decisions are what is compared"
    assert [s.body for s in second.sent] == [s.body for s in first.sent]
