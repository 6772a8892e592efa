from __future__ import annotations

import time
from typing import Any

from memory import MemoryLimits, MemoryStore, NewMemory
from memory.profiles import PROFILES
from memory.query import UserTurn
from memory.recaller import Recaller, RecallRequest, RecallResult, RecallSettings
from tests.conftest import Backend

NOW = 2_000_000_000.0
THERAPY = "Therapy Thursdays 3pm"
DEPLOYS = ("Deploys happen on Tuesdays", "Deploy freeze during the holidays", "Deploy notes: wiki")


def _tokens(text: str) -> int:
    return len(text) // 4


def _store(backend: Backend, *texts: str, limits: MemoryLimits | None = None) -> MemoryStore:
    store = backend.open(limits=limits, clock=lambda: NOW)
    for text in texts:
        store.add(NewMemory(owner="default", text=text, category="preference"))
    return store


def _turn(text: str = "when is therapy", index: int = 0) -> UserTurn:
    return UserTurn(index=index, text=text, last=True)


def _request(**overrides: Any) -> RecallRequest:
    fields: dict[str, Any] = {"owner": "default", "max_chars": 1000, "count_tokens": _tokens}
    return RecallRequest(**{**fields, **overrides})


def _recall(
    store: MemoryStore,
    turn: UserTurn | None = None,
    config: RecallSettings | None = None,
    **request: Any,
) -> RecallResult:
    recaller = Recaller(store, config or RecallSettings(), clock=lambda: NOW)
    recalled = recaller.recall(turn or _turn(), _request(**request))
    assert recalled is not None
    return recalled


def test_nothing_to_do_returns_none(backend: Backend) -> None:
    store = _store(backend, THERAPY)
    on = Recaller(store, RecallSettings(), clock=lambda: NOW)
    assert Recaller(store, RecallSettings(inject=False)).recall(_turn(), _request()) is None
    assert on.recall(None, _request()) is None
    stamped_only = _turn("[Sun 2026-11-22 11:28 UTC]\nRuntime: agent=main")
    assert on.recall(stamped_only, _request()) is None
    assert on.recall(_turn(), _request(owner="someone-else")) is None
    assert store.monitor.records(since=0) == []
    assert on.recall(_turn(), _request()) is not None  # the same store does recall


def test_recalls_a_relevant_memory_with_its_report(backend: Backend) -> None:
    store = _store(backend, THERAPY, "Coffee: oat milk flat white")
    recalled = _recall(store)
    assert recalled.lines == ("- Preference: Therapy Thursdays 3pm (today, you told me)",)
    tokens = _tokens(recalled.lines[0])  # 14
    signals = {
        "relevance": 100.0,  # 0-100, the best candidate 100
        "keyword": 100.0,
        "hop": 0.0,
        "context": 0.0,
        "speaker": 0.0,
        "recency": 50,
        "category": 10.0,
        "source": 10.0,
        "access": 0.0,
    }
    assert recalled.report.to_dict() == {
        "requested": "auto",
        "applied": "lean",
        "reason": "auto: a short query (3 words)",
        "candidates": 1,
        "injected": 1,
        "dropped": [],
        "chars": len(recalled.lines[0]) + 1,
        "maxChars": 1000,
        "tokens": tokens,
        "budget": {
            "agent": "main",
            "budgetProfile": "specialist-narrow",
            "complexity": "simple",
            "complexityReason": "short ask (3 words)",
            "agentTokens": 10_000,
            "windowTokens": None,
            "tokens": 10_000,
            "boundBy": "agent budget specialist-narrow × simple (10,000 tokens)",
        },
        "usage": {
            "tokensLoaded": tokens,
            "usagePercent": 0.1,
            "perScope": {"global": tokens},
            "exceeded": False,
            "warnings": [],
        },
        "boundBy": "candidates",
        "scopes": {
            "global": {"share": 2000, "tokens": tokens},
            "agent_recent": {"share": 5000, "tokens": 0},
            "agent_patterns": {"share": 3000, "tokens": 0},
        },
        "tooCommonWords": 0,
        "placement": "user",
        "memories": [{"id": store.all("default")[0].id, **signals, "score": 120.0}],
    }


def test_a_run_records_usage_and_counts_an_access_a_dry_run_does_neither(backend: Backend) -> None:
    store = _store(backend, THERAPY)
    dry = _recall(store, dry_run=True)
    assert dry.lines and dry.report.dry_run
    assert store.monitor.records(since=0) == []
    assert store.all("default")[0].access_count == 0
    real = _recall(store)
    assert real.lines == dry.lines
    assert [r["tokensLoaded"] for r in store.monitor.records(since=0)] == [_tokens(real.lines[0])]
    assert store.all("default")[0].access_count == 1


def test_a_turn_counts_one_access_however_often_it_is_recalled(backend: Backend) -> None:
    store = _store(backend, THERAPY)
    _recall(store, _turn(index=3))
    _recall(store, _turn(index=3))  # a tool loop resends the same turn
    assert store.all("default")[0].access_count == 1
    assert len(store.monitor.records(since=0)) == 2
    _recall(store, _turn(index=5))  # a later turn with the same text
    assert store.all("default")[0].access_count == 2


def test_max_chars_bounds_the_injected_block(backend: Backend) -> None:
    store = _store(backend, *DEPLOYS)
    loose = _recall(store, _turn("deploy"), profile="deep")
    assert len(loose.lines) == 3 and loose.report.chars == sum(len(x) + 1 for x in loose.lines)
    longest = max(len(x) + 1 for x in loose.lines)
    tight = _recall(store, _turn("deploy"), profile="deep", max_chars=longest)
    assert len(tight.lines) == 1 and tight.report.candidates == 3
    assert tight.report.chars == len(tight.lines[0]) + 1 <= longest
    assert tight.report.to_dict()["boundBy"] == f"char budget {longest:,}"


def test_the_budget_follows_the_agent_profile_and_a_stated_complexity(backend: Backend) -> None:
    store = _store(backend, THERAPY)
    config = RecallSettings(agents={"planner": "role-architect"}, placement="system")
    planner = _recall(store, config=config, agent="planner", complexity="complex").report
    budget = planner.to_dict()["budget"]
    assert (budget["agent"], budget["budgetProfile"]) == ("planner", "role-architect")
    assert (budget["complexity"], budget["agentTokens"]) == ("complex", 112_500)  # 75,000 × 1.5
    assert budget["complexityReason"] == "x-context-budget-complexity header"
    assert planner.placement == "system"
    assert store.monitor.records(since=0)[0]["budgetProfile"] == "role-architect"
    coder = _recall(store, config=config, agent="coder").report.budget  # not in `agents`
    assert (coder.profile, coder.complexity_reason) == ("specialist-narrow", "short ask (3 words)")


def test_profile_for(backend: Backend) -> None:
    empty = Recaller(_store(backend), RecallSettings())
    assert empty.profile_for("default", _turn(), "deep") is None
    recaller = Recaller(_store(backend, THERAPY), RecallSettings())
    assert recaller.profile_for("default", _turn(), "deep") is PROFILES["deep"]
    assert recaller.profile_for("default", _turn(), None) is PROFILES["lean"]  # auto, 3 words
    assert recaller.profile_for("default", None, "deep") is None
    off = Recaller(_store(backend, THERAPY), RecallSettings(inject=False))
    assert off.profile_for("default", _turn(), "deep") is None


def test_too_common_words_are_counted_and_listed_on_a_dry_run(backend: Backend) -> None:
    store = _store(backend, THERAPY, limits=MemoryLimits(max_memories=3000))
    # one batch: the count past `scan` is the point, not 2,001 transactions (~7 s on PostgreSQL)
    store.add_many(
        [
            NewMemory(owner="default", text=f"coffee note {i}")
            for i in range(PROFILES["lean"].scan + 1)
        ]
    )
    turn = _turn("coffee therapy")
    real = _recall(store, turn)
    assert real.lines == ("- Preference: Therapy Thursdays 3pm (today, you told me)",)
    assert real.report.to_dict()["tooCommonWords"] == 1
    dry = _recall(store, turn, dry_run=True).report.to_dict()
    assert dry["tooCommonWords"] == [{"word": "coffee", "memories": 2001}]


def test_deep_reports_its_second_hop_and_each_memorys_new_signals(backend: Backend) -> None:
    store = _store(
        backend,
        "Melanie took the kids to a pottery class",
        "The pottery class made clay bowls",
        *(f"Weather note {i}: rain again" for i in range(20)),
        "The kids painted their clay bowls blue",
    )
    turn = _turn("what pottery did Melanie make")
    looked = _recall(store, turn, profile="deep", dry_run=True).report.to_dict()
    assert "clay" in looked["secondHopWords"]
    assert all({"relevance", "hop", "context", "score"} <= set(m) for m in looked["memories"])
    assert _recall(store, turn, profile="deep", dry_run=True).report.to_dict() == looked
    # the shared report says how many words, not which: they are the owner's text
    shared = _recall(store, turn, profile="deep").report.to_dict()
    assert shared["secondHopWords"] == len(looked["secondHopWords"])
    assert "secondHopWords" not in _recall(store, turn, profile="balanced").report.to_dict()


def test_a_huge_turn_is_recalled_from_its_head_and_tail(backend: Backend) -> None:
    # a 2.7 MB paste of distinct words: recall read it all, ~2 s a MB (issue 24)
    paste = " ".join(f"w{i}x" for i in range(300_000))
    store = _store(backend, THERAPY, *DEPLOYS)
    started = time.perf_counter()
    recalled = _recall(store, _turn(f"{paste}\n\nwhen is therapy"))
    assert time.perf_counter() - started < 2
    assert recalled.lines and THERAPY in recalled.lines[0]
