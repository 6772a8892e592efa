"""How many tokens of memories a request may carry, and what bound it.

The memory budget of a request is the smallest of:

1. the agent's budget: its budget profile's tokens × the task's complexity multiplier
   (`simple` ×0.5, `medium` ×1, `complex` ×1.5, `multi-system` ×2), never above the
   profile's max;
2. 20% of the model's context window left after the system prompt;
3. the retrieval profile's inject cap (a number of memories, applied while packing);
4. `contextBudget.memoryMaxInjectedChars` when the budget is on (chars, applied while packing).

`decide` returns the token limit of 1 and 2 and names which one is smaller; recall packs under
it and the char and count caps, and reports whichever stopped it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

Complexity = Literal["simple", "medium", "complex", "multi-system"]
MULTIPLIER: dict[Complexity, float] = {
    "simple": 0.5,
    "medium": 1.0,
    "complex": 1.5,
    "multi-system": 2.0,
}
TIERS: tuple[Complexity, ...] = get_args(Complexity)
"""The complexity tiers, smallest first."""
WINDOW_SHARE = 0.2


@dataclass(frozen=True, kw_only=True)
class BudgetProfile:
    """An agent's memory budget (`specialist-narrow`, …): not a retrieval profile."""

    tokens: int
    """Memory tokens at `medium` complexity."""
    max_tokens: int
    """Never more than this, whatever the complexity."""
    scope_weights: dict[str, float]
    """How the budget splits between `global`, `agent_recent` and `agent_patterns`."""


DEFAULT_PROFILES: dict[str, BudgetProfile] = {
    "specialist-narrow": BudgetProfile(
        tokens=20_000,
        max_tokens=50_000,
        scope_weights={"global": 0.2, "agent_recent": 0.5, "agent_patterns": 0.3},
    ),
    "specialist-broad": BudgetProfile(
        tokens=35_000,
        max_tokens=75_000,
        scope_weights={"global": 0.3, "agent_recent": 0.4, "agent_patterns": 0.3},
    ),
    "role-coordinator": BudgetProfile(
        tokens=50_000,
        max_tokens=100_000,
        scope_weights={"global": 0.5, "agent_recent": 0.3, "agent_patterns": 0.2},
    ),
    "role-architect": BudgetProfile(
        tokens=75_000,
        max_tokens=150_000,
        scope_weights={"global": 0.4, "agent_recent": 0.2, "agent_patterns": 0.4},
    ),
}

_MULTI = re.compile(r"\b(across|between|integrat\w*|migrat\w*|end-to-end|services|systems)\b", re.I)
_COMPLEX = re.compile(
    r"\b(why|design|architect\w*|refactor\w*|debug\w*|compare|trade-?offs?)\b", re.I
)


def detect(query: str) -> tuple[Complexity, str]:
    """The task's complexity from the user's text, and why."""
    words = len(query.split())
    if _MULTI.search(query) and words > 8:
        return "multi-system", "mentions several systems"
    if _COMPLEX.search(query) or words > 60:
        return "complex", "design/debug/why question" if _COMPLEX.search(query) else "long ask"
    if words <= 6:
        return "simple", f"short ask ({words} word{'' if words == 1 else 's'})"
    return "medium", f"ordinary ask ({words} words)"


def bump(tier: Complexity) -> Complexity:
    """One tier up (soft enforcement after an agent exceeded its budget)."""
    return TIERS[min(TIERS.index(tier) + 1, len(TIERS) - 1)]


@dataclass(frozen=True, kw_only=True)
class Decision:
    """The memory token budget of one request and what set it."""

    agent: str
    profile: str
    complexity: Complexity
    complexity_reason: str
    agent_tokens: int
    window_tokens: int | None
    tokens: int
    bound_by: str

    def to_dict(self) -> dict[str, object]:
        return {
            "agent": self.agent,
            "budgetProfile": self.profile,
            "complexity": self.complexity,
            "complexityReason": self.complexity_reason,
            "agentTokens": self.agent_tokens,
            "windowTokens": self.window_tokens,
            "tokens": self.tokens,
            "boundBy": self.bound_by,
        }


def decide(
    *,
    agent: str,
    profile_name: str,
    profile: BudgetProfile,
    complexity: Complexity,
    complexity_reason: str,
    context_window: int | None,
    system_tokens: int,
) -> Decision:
    """The token budget: min(agent budget, 20% of the window left after the system prompt)."""
    agent_tokens = min(int(profile.tokens * MULTIPLIER[complexity]), profile.max_tokens)
    window = None
    if context_window is not None:
        window = max(0, int((context_window - system_tokens) * WINDOW_SHARE))
    if window is not None and window < agent_tokens:
        tokens, bound = window, f"20% of the context window left ({window:,} tokens)"
    else:
        tokens, bound = (
            agent_tokens,
            f"agent budget {profile_name} × {complexity} ({agent_tokens:,} tokens)",
        )
    return Decision(
        agent=agent,
        profile=profile_name,
        complexity=complexity,
        complexity_reason=complexity_reason,
        agent_tokens=agent_tokens,
        window_tokens=window,
        tokens=tokens,
        bound_by=bound,
    )
