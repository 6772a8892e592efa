"""The session stage, the client prefix and what the clamp reports are O(new) (issue 34): on
request N+1 of a long conversation, the blocks the session compares, the segments the wire maps
to its own messages and the prunable results the prune stage looks at are the new turn's, not
the whole history's; and what they decide is what the whole pass decides (the test suite's
`CTXBUDGET_CHECK_RESENT=1` re-runs each resumed step whole and fails on a difference)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxbudget.proxy.cache import sessions
from ctxbudget.proxy.cache.resent import RESENT
from ctxbudget.proxy.pipeline import prune
from ctxbudget.proxy.wire import view
from tests.fakes import FakeUpstream, answer_in
from tests.inproc import Counted, InProcess, cutting_config, proxy_app, state_of

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench._growing import BUILDERS  # noqa: E402

PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages"}


def _config(tmp_path: Path) -> dict[str, Any]:
    """Clamps that cut most results (so the history holds many clamped blocks) and pruning that
    finds most of them prunable (so the clamp reports many prunable results)."""
    pruning = {"mode": "cache-ttl", "minPrunableToolChars": 200, "keepLastAssistants": 2}
    return cutting_config(tmp_path, pruning=pruning)


def _send(client: InProcess, fake: FakeUpstream, wire: str, raw: bytes) -> Any:
    answer_in(fake, wire)
    r = client.post(PATHS[wire], content=raw)
    assert r.status_code == 200, r.text
    return r


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counted]:
    found = Counted(monkeypatch)
    # as in production: the suite's re-check of every reuse works the whole list again
    monkeypatch.setattr(RESENT, "check", False)
    found.count(sessions, "Moved")  # a block the report prices (moved, or cached on one side)
    found.count(view, "real_segment")  # a view segment placed at its real message
    found.count(prune, "_key")  # a prunable result looked up among the decisions
    run = prune.PruneStage.run

    async def seen(stage: prune.PruneStage, *args: Any, **kwargs: Any) -> prune.Pruned:
        found.calls["prunable"] = len(kwargs["prunable"])
        return await run(stage, *args, **kwargs)

    monkeypatch.setattr(prune.PruneStage, "run", seen)
    yield found


@pytest.mark.parametrize("wire", ["chat", "messages"])
def test_turn_n_compares_maps_and_prunes_only_its_new_blocks(
    tmp_path: Path, wire: str, counted: Counted
) -> None:
    """Request N+1 is request N plus a turn: however many clamped blocks, segments and
    prunable results the history holds, the stages look at the new turn's few."""
    # a tool turn (every tenth, the user asks again); what the stages would look at again
    # grows by the block, so turn 38's ~23 clamped blocks and ~36 prunable results show it
    bodies = BUILDERS[wire][1](38)
    with proxy_app(tmp_path, _config(tmp_path)) as (client, fake):
        for raw in bodies[:-1]:
            _send(client, fake, wire, raw)
        counted.calls.clear()
        reply = _send(client, fake, wire, bodies[-1])
        state_of(client).reports.flush()
        record = state_of(client).reports.request(reply.headers["x-context-budget-request-id"])
    assert record is not None
    # the history is long, and most of it clamped and prunable: O(history) would show
    assert int(reply.headers["x-context-budget-clamped"]) > 20
    assert counted.calls["prunable"] > 20, counted.calls
    assert counted.calls.get("Moved", 0) <= 6, counted.calls
    assert counted.calls.get("real_segment", 0) <= 8, counted.calls
    assert counted.calls.get("_key", 0) <= 4, counted.calls
