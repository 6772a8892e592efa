from __future__ import annotations

from pathlib import Path

from memory import SQLiteMemoryStore
from memory.budget import DEFAULT_PROFILES
from memory.monitor import Usage, analyze

WEIGHTS = {name: dict(p.scope_weights) for name, p in DEFAULT_PROFILES.items()}


def _usage(
    loaded: int,
    *,
    agent: str = "main",
    profile: str = "specialist-narrow",
    scopes: dict[str, int] | None = None,
    ts: float = 1000.0,
) -> Usage:
    return Usage(
        ts=ts,
        owner="default",
        agent=agent,
        budget_profile=profile,
        retrieval_profile="balanced",
        complexity="medium",
        budget=1000,
        tokens_loaded=loaded,
        tokens_injected=min(loaded, 1000),
        per_scope=scopes or {"global": loaded},
    )


def test_thresholds() -> None:
    assert _usage(500).warnings == []
    assert _usage(750).warnings == ["info: 75% of the memory budget"]
    assert _usage(900).warnings == ["warning: 90% of the memory budget"]
    over = _usage(1200)
    assert over.exceeded and over.warnings[0].startswith("exceeded: 120% of 1,000 tokens")


def test_an_exceeded_request_bumps_the_next_one_once(tmp_path: Path) -> None:
    monitor = SQLiteMemoryStore(tmp_path / "m.db").monitor
    monitor.record(_usage(500))
    assert not monitor.take_bump("default", "main")
    monitor.record(_usage(1500))
    assert monitor.take_bump("default", "main")
    assert not monitor.take_bump("default", "main")
    assert [r["tokensLoaded"] for r in monitor.records(since=0)] == [500, 1500]


def test_analyze_recommends_on_a_seeded_log() -> None:
    log = (
        [_usage(1300, agent="coder").to_dict() for _ in range(10)]
        + [_usage(900, agent="coder").to_dict() for _ in range(10)]
        + [_usage(100, agent="writer", profile="role-coordinator").to_dict() for _ in range(40)]
        + [
            _usage(
                800, agent="ops", scopes={"global": 800, "agent_recent": 0, "agent_patterns": 0}
            ).to_dict()
            for _ in range(5)
        ]
    )
    found = {(r["agent"], r["kind"]): r for r in analyze(log, WEIGHTS)}
    up = found[("coder", "upgrade")]
    assert (up["from"], up["to"]) == ("specialist-narrow", "specialist-broad")
    assert up["reason"] == "exceeded its budget on 50% of 20 requests (> 20%)"
    down = found[("writer", "downgrade")]
    assert down["to"] == "specialist-broad" and down["confidence"] == 0.89
    drift = found[("ops", "scope-weights")]
    assert drift["to"] == {"global": 1.0, "agent_recent": 0.0, "agent_patterns": 0.0}
    assert drift["confidence"] < 0.5  # 5 requests: little evidence
    assert ("coder", "scope-weights") in found  # all global, weights say 20%
