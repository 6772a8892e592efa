from __future__ import annotations

from ctxbudget.memory.budget import DEFAULT_PROFILES, bump, decide, detect


def test_complexity_is_detected_and_explained() -> None:
    assert detect("coffee order?") == ("simple", "short ask (2 words)")
    assert detect("coffee?") == ("simple", "short ask (1 word)")
    assert detect("why does the deploy keep failing on tuesdays?")[0] == "complex"
    assert detect("migrate the billing data between the two services and the warehouse")[0] == (
        "multi-system"
    )
    assert detect("please summarise the notes from our meeting this morning")[0] == "medium"
    assert bump("complex") == "multi-system" and bump("multi-system") == "multi-system"


def test_budget_is_the_agent_budget_or_20_percent_of_the_window() -> None:
    narrow = DEFAULT_PROFILES["specialist-narrow"]
    d = decide(
        agent="main",
        profile_name="specialist-narrow",
        profile=narrow,
        complexity="complex",
        complexity_reason="",
        context_window=None,
        system_tokens=0,
    )
    assert d.tokens == 30_000 and d.bound_by.startswith("agent budget specialist-narrow")
    capped = decide(
        agent="main",
        profile_name="specialist-narrow",
        profile=narrow,
        complexity="multi-system",
        complexity_reason="",
        context_window=None,
        system_tokens=0,
    )
    assert capped.tokens == 40_000  # 20k × 2, under the 50k max
    small = decide(
        agent="main",
        profile_name="specialist-narrow",
        profile=narrow,
        complexity="medium",
        complexity_reason="",
        context_window=32_000,
        system_tokens=12_000,
    )
    assert small.tokens == 4_000 and small.bound_by.startswith("20% of the context window")
