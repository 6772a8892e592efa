from __future__ import annotations

from ctxbudget.memory.budget import DEFAULT_PROFILES
from ctxbudget.memory.monitor import MIN_REQUESTS, Usage, analyze
from tests.conftest import Backend


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


def test_an_exceeded_request_bumps_the_next_one_once(backend: Backend) -> None:
    monitor = backend.open().monitor
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
            for _ in range(25)
        ]
    )
    result = analyze(log, DEFAULT_PROFILES)
    assert result["tooFewRequests"] == []
    found = {(r["agent"], r["kind"]): r for r in result["recommendations"]}
    up = found[("coder", "upgrade")]
    assert (up["from"], up["to"]) == ("specialist-narrow", "specialist-broad")
    assert up["reason"] == "exceeded its budget on 50% of 20 requests (> 20%)"
    assert up["sharedWith"] == ["ops"]  # the profile their last requests used
    down = found[("writer", "downgrade")]
    assert down["to"] == "specialist-broad" and down["confidence"] == 0.89
    drift = found[("ops", "scope-weights")]
    assert drift["to"] == {"global": 1.0, "agent_recent": 0.0, "agent_patterns": 0.0}
    assert drift["confidence"] == 0.71
    assert ("coder", "scope-weights") in found  # all global, weights say 20%
    # without memory.budgets.agents, a map to paste would drop entries it does not know
    assert all(r["set"] == {} for r in result["recommendations"])


def test_analyze_wants_a_minimum_sample_per_agent() -> None:
    log = [_usage(1500, agent="main").to_dict() for _ in range(3)]
    result = analyze(log, DEFAULT_PROFILES)
    assert result == {
        "minRequests": MIN_REQUESTS,
        "recommendations": [],
        "tooFewRequests": [{"agent": "main", "profile": "specialist-narrow", "requests": 3}],
    }
    lowered = analyze(log, DEFAULT_PROFILES, min_requests=3)["recommendations"]
    assert [(r["kind"], r["confidence"]) for r in lowered] == [
        ("upgrade", 0.24),
        ("scope-weights", 0.24),
    ]


def test_a_change_to_a_shared_profile_names_who_shares_it_and_touches_only_the_agent() -> None:
    log = [_usage(600, agent="ops", scopes={"global": 600}).to_dict() for _ in range(20)]
    log += [_usage(100, agent="coder").to_dict() for _ in range(2)]
    agents = {"writer": "specialist-narrow", "lead": "role-architect"}
    (drift,) = analyze(log, DEFAULT_PROFILES, agents=agents, default_profile="role-coordinator")[
        "recommendations"
    ]
    assert drift["sharedWith"] == ["writer"]  # coder, unlisted, is role-coordinator by config
    assert drift["sharedWithUnlisted"] is False
    profiles = drift["set"]["memory.budgets.profiles"]
    assert profiles["ops-tuned"] == {
        "tokens": 20000,
        "maxTokens": 50000,
        "scopeWeights": {"global": 1.0, "agent_recent": 0.0, "agent_patterns": 0.0},
    }
    assert profiles["specialist-narrow"]["scopeWeights"] == {
        "global": 0.2,
        "agent_recent": 0.5,
        "agent_patterns": 0.3,
    }
    assert set(profiles) == {*DEFAULT_PROFILES, "ops-tuned"}
    assert drift["set"]["memory.budgets.agents"] == {**agents, "ops": "ops-tuned"}

    # Nobody else uses it: the profile itself changes, and the agents map is left alone.
    mine = {"ops": "specialist-narrow"}
    (alone,) = analyze(log, DEFAULT_PROFILES, agents=mine, default_profile="role-coordinator")[
        "recommendations"
    ]
    assert alone["sharedWith"] == []
    assert list(alone["set"]) == ["memory.budgets.profiles"]
    weights = alone["set"]["memory.budgets.profiles"]["specialist-narrow"]["scopeWeights"]
    assert weights == {"global": 1.0, "agent_recent": 0.0, "agent_patterns": 0.0}

    # The default profile is shared with every agent the config does not list.
    (default,) = analyze(log, DEFAULT_PROFILES, agents={}, default_profile="specialist-narrow")[
        "recommendations"
    ]
    assert default["sharedWith"] == ["coder"] and default["sharedWithUnlisted"] is True
    assert default["set"]["memory.budgets.agents"] == {"ops": "ops-tuned"}
