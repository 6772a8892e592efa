from __future__ import annotations

import dataclasses

from memory import MemoryLimits, MemoryStore, NewMemory
from memory.inject import inject, line
from memory.profiles import PROFILES, RetrievalProfile, choose
from memory.selection import DAY, Selection, recency_points, rewrite, select_memories
from tests.conftest import Backend

NOW = 2_000_000_000.0
# deep without the signals that memories added one after another lend each other (tested below)
KEYWORDS = dataclasses.replace(PROFILES["deep"], context=0.0, hop=False)


def _store(backend: Backend, texts: list[tuple[str, str]]) -> MemoryStore:
    clock = iter(range(10**6))
    store = backend.open(clock=lambda: NOW - 3 * DAY + next(clock))
    for text, category in texts:
        store.add(NewMemory(owner="default", text=text, category=category))
    return store


def test_rewrite_splits_compounds_and_adds_no_hand_written_synonyms() -> None:
    words = rewrite("deployScript release_notes coffee")
    assert words == [
        "deploy",
        "script",
        "deployscript",
        "release",
        "notes",
        "releasenotes",
        "coffee",
    ]
    assert rewrite("deployScript release_notes coffee") == words  # deterministic


def test_auto_says_why() -> None:
    assert choose("auto", "coffee?")[1] == "auto: a short query (1 word)"
    assert choose("auto", "why did the deploy fail on tuesday")[0].name == "deep"
    assert choose("auto", "look at proxy/app.py please")[1] == "auto: code terms in the query"
    assert choose("lean", "why?")[1] == "lean requested"


def test_recency_steps() -> None:
    assert [recency_points(d * DAY) for d in (0.5, 1.5, 3, 20, 90)] == [50, 40, 30, 15, 5]


def test_scores_are_explainable_and_packing_respects_the_budget(backend: Backend) -> None:
    store = _store(
        backend,
        [
            ("Deploys happen on Tuesdays", "fact"),
            ("Deploy freeze during the holidays", "pattern"),
            ("x", "fact"),
        ],
    )
    result = select_memories(
        store,
        "default",
        "deploy days",
        KEYWORDS,
        "deep requested",
        limits=MemoryLimits(),
        now=NOW,
        max_chars=1000,
        count_tokens=lambda t: len(t) // 4,
    )
    assert [c.memory.text for c in result.chosen][:1] == ["Deploys happen on Tuesdays"]
    signals = result.chosen[0].signals()
    assert signals["recency"] == 30 and signals["source"] == 10 and signals["category"] == 10
    assert signals["score"] == signals["relevance"] / 2 + 30 + 10 + 10 + signals["access"]
    tight = select_memories(
        store,
        "default",
        "deploy",
        KEYWORDS,
        "deep requested",
        limits=MemoryLimits(),
        now=NOW,
        max_chars=30,
        count_tokens=len,
    )
    assert len(tight.chosen) == 1 and tight.bound_by == "char budget 30"


def test_lean_trust_pass_drops_and_says_why(backend: Backend) -> None:
    store = _store(backend, [("tea", "preference"), ("Tea with oat milk, no sugar", "preference")])
    result = select_memories(
        store,
        "default",
        "tea",
        PROFILES["lean"],
        "lean requested",
        limits=MemoryLimits(),
        now=NOW,
        max_chars=1000,
        count_tokens=len,
    )
    assert [c.memory.text for c in result.chosen] == ["Tea with oat milk, no sugar"]
    assert [why for _, why in result.dropped] == ["shorter than 12 chars"]


def test_agent_scope_only_reaches_that_agent(backend: Backend) -> None:
    store = backend.open()
    store.add(NewMemory(owner="default", text="coder agent uses pytest", scope="agent:coder"))
    for agent, found in ((None, 0), ("writer", 0), ("coder", 1)):
        result = select_memories(
            store,
            "default",
            "pytest",
            PROFILES["deep"],
            "",
            limits=MemoryLimits(),
            now=NOW,
            max_chars=1000,
            count_tokens=len,
            scope=agent,
        )
        assert len(result.chosen) == found, agent


def test_injection_is_cache_safe(backend: Backend) -> None:
    store = _store(backend, [("Therapy Thursdays 3pm", "preference")])
    memory = store.all("default")[0]
    text = line(memory, now=NOW + 14 * DAY)
    assert text.startswith("- Preference: Therapy Thursdays 3pm (2 weeks ago, you told me)")
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": [{"type": "text", "text": "again"}]},
    ]
    out = inject(messages, [text], "user")
    assert out[:3] == messages[:3] and out[0] is messages[0]
    assert out[3]["content"][-1]["text"] == "User context:\n" + text
    assert inject(messages, [text], "system")[0]["content"] == "S\n\nUser context:\n" + text
    assert inject(messages, [], "user") is messages


def test_deep_matches_word_prefixes_and_lean_does_not(backend: Backend) -> None:
    store = _store(backend, [("The orionwave project deadline notes", "fact")])
    for profile, found in (("lean", 0), ("balanced", 0), ("deep", 1)):
        result = select_memories(
            store,
            "default",
            "orion?",
            PROFILES[profile],
            profile,  # type: ignore[index]
            limits=MemoryLimits(),
            now=NOW,
            max_chars=1000,
            count_tokens=len,
        )
        assert len(result.chosen) == found, profile


def test_words_too_common_to_rank_are_skipped_rarest_first(backend: Backend) -> None:
    texts = [(f"standup notes number {i}", "fact") for i in range(30)]
    store = _store(backend, [*texts, ("standup moved to the blue room", "fact")])
    narrow = dataclasses.replace(KEYWORDS, prefix=False, scan=10)

    def run(query: str, profile: RetrievalProfile) -> Selection:
        return select_memories(
            store,
            "default",
            query,
            profile,
            "",
            limits=MemoryLimits(),
            now=NOW,
            max_chars=1000,
            count_tokens=len,
        )

    result = run("standup blue room", narrow)
    assert result.skipped == [("standup", 31)]
    assert [c.memory.text for c in result.candidates] == ["standup moved to the blue room"]
    only_common = run("standup notes", narrow)
    assert only_common.candidates == [] and only_common.bound_by == (
        "every query word too common to rank"
    )
    wide = run("standup notes", KEYWORDS)
    assert wide.skipped == [] and len(wide.candidates) == 31


def test_scope_weights_split_the_token_budget(backend: Backend) -> None:
    store = _store(
        backend, [(f"release checklist step {i} for the release", "fact") for i in range(4)]
    )
    for i in range(2):
        store.add(NewMemory(owner="default", text=f"coder release habit {i}", scope="agent:coder"))

    def run(weights: dict[str, float] | None) -> list[str]:
        result = select_memories(
            store,
            "default",
            "release",
            KEYWORDS,
            "",
            limits=MemoryLimits(),
            now=NOW,
            max_chars=10_000,
            count_tokens=lambda t: 10,
            max_tokens=40,
            scope="coder",
            scope_weights=weights,
        )
        if weights:
            assert result.scopes["agent_recent"]["share"] == int(40 * weights["agent_recent"])
        return [c.memory.scope for c in result.chosen]

    assert run(None) == ["global"] * 4  # the global memories score higher
    split = run({"global": 0.25, "agent_recent": 0.5, "agent_patterns": 0.25})
    assert sorted(split) == ["agent:coder", "agent:coder", "global", "global"]
    # a scope's unused share goes to the best of the rest
    assert run({"global": 0.0, "agent_recent": 0.25, "agent_patterns": 0.75}).count("global") == 3
