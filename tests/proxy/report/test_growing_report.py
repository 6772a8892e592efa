"""The report of a growing conversation (issue 34): request N+1 resends request N's segments,
and each is counted, described and summed once, when first seen (`proxy/report/tally.py`);
what `/context/budget`, the headers and the totals say is what each request alone says."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxbudget.caps import Segment
from ctxbudget.proxy.cache.resent import RESENT
from ctxbudget.proxy.report.tally import STRIDE
from tests.fakes import FakeUpstream, chat_completion
from tests.inproc import InProcess, config_for, proxy_app, state_of

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench._growing import BUILDERS  # noqa: E402

PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages"}
SEGMENT_FIELDS = (
    "segments",
    "segmentsSeen",
    "clamped",
    "wouldClamp",
    "savedChars",
    "savedTokens",
    "wouldSaveChars",
    "wouldSaveTokens",
    "savedUsd",
    "wouldSaveUsd",
    "inputPricePerMTok",
)
"""What a report entry says of its segments (the rest is the session's: busts, money)."""
HEADERS = ("clamped", "saved-chars", "saved-tokens", "gross-saved-usd", "would-clamp")
HEADERS += ("would-save-chars", "would-save-tokens", "gross-would-save-usd")


def _config(tmp_path: Path, enabled: bool) -> dict[str, Any]:
    budget = {
        "enabled": enabled,
        "webFetchMaxChars": 1200,
        "toolOutputMaxChars": 900,
        "bootstrapMaxChars": 1500,
    }
    return config_for(
        tmp_path,
        agents={"defaults": {"contextBudget": budget}},
        memory={"inject": {"enabled": False}},
    )


def _send(client: InProcess, fake: FakeUpstream, wire: str, raw: bytes) -> tuple[str, dict]:
    if wire == "chat":
        fake.answer_json(chat_completion(model="gpt-4o"))
    else:
        fake.answer_json(
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-5",
                "content": [{"type": "text", "text": "ok"}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 10, "output_tokens": 2},
            }
        )
    r = client.post(PATHS[wire], content=raw)
    assert r.status_code == 200, r.text
    headers = {h: r.headers.get(f"x-context-budget-{h}") for h in HEADERS}
    return r.headers["x-context-budget-request-id"], headers


def _seen(client: InProcess, request_id: str) -> dict[str, Any]:
    reports = state_of(client).reports
    reports.flush()
    found = reports.request(request_id)
    assert found is not None
    return {k: found[k] for k in SEGMENT_FIELDS}


def _totals(client: InProcess) -> dict[str, Any]:
    reports = state_of(client).reports
    reports.flush()
    totals = reports.summary(recent=0)["totals"]
    return {k: v for k, v in totals.items() if k not in ("summaries", "money")}


def _added(into: dict[str, Any], more: dict[str, Any]) -> None:
    for key, value in more.items():
        if isinstance(value, dict):
            _added(into.setdefault(key, {}), value)
        else:
            into[key] = into.get(key, 0) + value


@pytest.mark.parametrize(("wire", "enabled"), [("chat", True), ("chat", False), ("messages", True)])
def test_a_grown_conversations_report_is_each_requests_report_alone(
    tmp_path: Path, wire: str, enabled: bool
) -> None:
    """One app, which carries each request's tally to the next of its conversation, against
    a fresh app for each request: every entry's segments and sums, every header, and the
    totals added up are the same."""
    bodies = BUILDERS[wire][1](24)
    grown: list[tuple[dict[str, Any], dict[str, Any]]] = []
    (tmp_path / "kept").mkdir()
    with proxy_app(tmp_path / "kept", _config(tmp_path / "kept", enabled)) as (client, fake):
        for raw in bodies:
            request_id, headers = _send(client, fake, wire, raw)
            grown.append((_seen(client, request_id), headers))
        grown_totals = _totals(client)
    fresh_totals: dict[str, Any] = {}
    for n, raw in enumerate(bodies):
        folder = tmp_path / f"fresh-{n}"
        folder.mkdir()
        with proxy_app(folder, _config(folder, enabled)) as (client, fake):
            request_id, headers = _send(client, fake, wire, raw)
            assert (_seen(client, request_id), headers) == grown[n], f"request {n}"
            _added(fresh_totals, _totals(client))
    _same(grown_totals, fresh_totals)
    action = "clamped" if enabled else "would-clamp"
    assert any(s["action"] == action for s in grown[-1][0]["segments"])  # it clamped


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Nested totals equal: counts exactly, money to the float's last digits (summed in
    another order)."""
    assert a.keys() == b.keys()
    for key, value in a.items():
        if isinstance(value, dict):
            _same(value, b[key])
        elif isinstance(value, float):
            assert value == pytest.approx(b[key], rel=1e-12), key
        else:
            assert value == b[key], key


class _Reads:
    """Reads of a segment's saving (`Segment.saved`): what the headers, the token counts, the
    report's entries and its sums each look at, on the request path and the writer thread."""

    def __init__(self) -> None:
        self.count = 0

    def reset(self) -> None:
        self.count = 0


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Reads]:
    found = _Reads()
    real = Segment.saved

    def saved(self: Segment) -> int:
        found.count += 1
        return real.fget(self)  # type: ignore[misc, no-any-return]

    monkeypatch.setattr(Segment, "saved", property(saved))
    # as in production: the test suite's re-check of every reuse works the whole list again
    monkeypatch.setattr(RESENT, "check", False)
    yield found


@pytest.mark.parametrize("wire", ["chat", "messages"])
def test_turn_300_looks_only_at_its_new_segments(tmp_path: Path, wire: str, reads: _Reads) -> None:
    """Request N+1 adds a tool call and its result to a conversation of ~300 messages and
    ~150 clamped segments: its headers, token counts, report entry and totals look at the
    new segment, not the ones request N had."""
    bodies = BUILDERS[wire][1](149)  # the last a tool turn (every tenth, the user asks)
    with proxy_app(tmp_path, _config(tmp_path, True)) as (client, fake):
        for raw in bodies[:-1]:
            _send(client, fake, wire, raw)
        state_of(client).reports.flush()
        reads.reset()
        request_id, _ = _send(client, fake, wire, bodies[-1])
        state_of(client).reports.flush()
        looked = reads.count
        seen = _seen(client, request_id)
    assert seen["segmentsSeen"] > 100 and seen["clamped"] > 50
    # the new segments (a result, and Messages' last newest one: its item is other bytes
    # now), each counted, described and summed; and at most a checkpoint's stride of old
    # ones summed again
    assert looked <= 3 * 3 + STRIDE, looked
