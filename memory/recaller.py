"""Memory's front door: which memories one user turn gets, within which budget, and why.

The proxy and `ctxbudget recall` both come here. A `Recaller` takes the user turn a wire
adapter found and a typed `RecallRequest`, and returns the lines to inject plus a
`RecallReport` for the report, the headers and the CLI. It touches SQLite: callers on an event
loop run it in a thread.

    turn ─► choose retrieval profile ─► budget (agent × complexity, window) ─► recall/pack
         ─► usage record (monitor) ─► count one access per turn ─► lines + RecallReport
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memory.budget import DEFAULT_PROFILES, BudgetProfile, Complexity, Decision, bump, decide
from memory.budget import detect as detect_complexity
from memory.inject import Placement, line
from memory.monitor import Usage, scope_of
from memory.profiles import RequestedProfile, RetrievalProfile, choose
from memory.query import UserTurn
from memory.selection import select_memories
from memory.store import MemoryStore

DEFAULT_BUDGET_PROFILE = "specialist-narrow"


@dataclass(frozen=True, kw_only=True)
class RecallSettings:
    """What recall reads of the settings in force (from `memory.inject` and `memory.budgets`)."""

    inject: bool = True
    """Inject memories at all (`memory.inject.enabled`)."""
    profile: RequestedProfile = "auto"
    """Retrieval profile when the request names none (`memory.inject.budget`)."""
    placement: Placement = "user"
    """Where the block goes (`memory.inject.placement`)."""
    budget_profiles: Mapping[str, BudgetProfile] = field(
        default_factory=lambda: dict(DEFAULT_PROFILES)
    )
    """Agent budget profiles by name."""
    agents: Mapping[str, str] = field(default_factory=dict)
    """Agent name → budget profile name."""
    default_budget_profile: str = DEFAULT_BUDGET_PROFILE
    """Budget profile of agents not in `agents`."""
    default_agent: str = "main"
    """Agent of requests that name none."""


@dataclass(frozen=True, kw_only=True)
class RecallRequest:
    """One request's side of recall: who asks, what it may spend, how to count."""

    owner: str
    agent: str | None = None
    """The agent the request is for (`x-context-budget-agent`, else OpenClaw's
    `Runtime: agent=…` line); None: `RecallSettings.default_agent`. Memories scoped
    `agent:<that agent>` are recalled besides the global ones."""
    profile: RequestedProfile | None = None
    """Requested retrieval profile; None: `RecallSettings.profile`."""
    complexity: Complexity | None = None
    """Stated task complexity; None: detected from the query."""
    max_chars: int
    """Most UTF-16 chars the injected block may take (the memory cap in force)."""
    count_tokens: Callable[[str], int]
    """Tokens of a text in the request model's encoding."""
    context_window: int | None = None
    """The model's input window in tokens, when known."""
    system_text: str = ""
    """The request's system prompt (what is left of the window is measured after it)."""
    extra_words: Sequence[str] = ()
    """More search words (deep's LLM rewrite)."""
    rewrite_note: str | None = None
    """Where `extra_words` came from, for the report."""
    dry_run: bool = False
    """Only look: no usage record, no access counted, no pending tier bump taken."""


@dataclass(frozen=True, kw_only=True)
class RecallReport:
    """What recall did for one request (ids and signals only: memory text is its owner's)."""

    requested: str
    applied: str
    reason: str
    candidates: int
    injected: int
    dropped: tuple[tuple[int, str], ...]
    """(memory id, why) of candidates left out."""
    chars: int
    max_chars: int
    tokens: int
    budget: Decision
    usage: Usage
    bound_by: str
    scopes: dict[str, Any]
    too_common: tuple[tuple[str, int], ...]
    """Query words skipped as too common to rank, with how many memories hold each."""
    hop_words: tuple[str, ...] = ()
    """The words deep's second hop searched (taken from the owner's memories)."""
    placement: str
    memories: tuple[dict[str, Any], ...]
    """Each injected memory: its id and score signals."""
    rewrite: str | None = None
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        usage = self.usage.to_dict()
        out: dict[str, Any] = {
            "requested": self.requested,
            "applied": self.applied,
            "reason": self.reason,
            "candidates": self.candidates,
            "injected": self.injected,
            "dropped": [{"id": i, "why": why} for i, why in self.dropped],
            "chars": self.chars,
            "maxChars": self.max_chars,
            "tokens": self.tokens,
            "budget": self.budget.to_dict(),
            "usage": {
                k: v
                for k, v in usage.items()
                if k in ("tokensLoaded", "usagePercent", "perScope", "exceeded", "warnings")
            },
            "boundBy": self.bound_by,
            "scopes": self.scopes,
            # the person who typed the query (CLI) sees the words; the shared report a count
            "tooCommonWords": (
                [{"word": w, "memories": n} for w, n in self.too_common]
                if self.dry_run
                else len(self.too_common)
            ),
            "placement": self.placement,
            "memories": [dict(m) for m in self.memories],
        }
        if self.hop_words:
            # words of the owner's memories: the CLI's user sees them, the shared report a count
            out["secondHopWords"] = list(self.hop_words) if self.dry_run else len(self.hop_words)
        if self.rewrite is not None:
            out["rewrite"] = self.rewrite
        return out


@dataclass(frozen=True, kw_only=True)
class RecallResult:
    """Recall's answer: the memory lines to place (maybe none) and the report."""

    lines: tuple[str, ...]
    report: RecallReport


class Recaller:
    """Recall against one store with one config; cheap to make per request."""

    def __init__(
        self,
        store: MemoryStore,
        config: RecallSettings,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.config = config
        self._clock = clock

    def profile_for(
        self, owner: str, turn: UserTurn | None, requested: RequestedProfile | None
    ) -> RetrievalProfile | None:
        """The retrieval profile recall would use; None when it would not run at all."""
        if not self.config.inject or turn is None:
            return None
        query = turn.query
        if not query or not self.store.has_any(owner):
            return None
        return choose(requested or self.config.profile, query)[0]

    def recall(self, turn: UserTurn | None, request: RecallRequest) -> RecallResult | None:
        """The memories for `turn`, or None when there is nothing to do (off, no query, none)."""
        cfg = self.config
        if not cfg.inject or turn is None:
            return None
        query = turn.query
        store = self.store
        owner = request.owner
        if not query or not store.has_any(owner):
            return None
        requested = request.profile or cfg.profile
        profile, reason = choose(requested, query)
        now = self._clock()
        agent = request.agent or cfg.default_agent
        budget_name = cfg.agents.get(agent, cfg.default_budget_profile)
        budget_profile = cfg.budget_profiles.get(budget_name)
        if budget_profile is None:  # the config loader refuses unknown names; say what applied
            budget_name = DEFAULT_BUDGET_PROFILE
            budget_profile = DEFAULT_PROFILES[DEFAULT_BUDGET_PROFILE]
        tier, tier_reason = self._complexity(query, request, agent)
        decision = decide(
            agent=agent,
            profile_name=budget_name,
            profile=budget_profile,
            complexity=tier,
            complexity_reason=tier_reason,
            context_window=request.context_window,
            system_tokens=request.count_tokens(request.system_text),
        )
        result = select_memories(
            store,
            owner,
            query,
            profile,
            reason,
            limits=store.limits,
            now=now,
            max_chars=request.max_chars,
            count_tokens=request.count_tokens,
            max_tokens=decision.tokens,
            scope=agent,  # the agent the usage record names: its memories are recalled
            scope_weights=budget_profile.scope_weights,
            extra_words=request.extra_words,
            format_line=lambda m: line(m, now=now),
        )
        dropped_ids = {c.memory.id for c, _ in result.dropped}
        per_scope: dict[str, int] = {}
        for c in result.candidates:
            if c.memory.id in dropped_ids:
                continue
            key = scope_of(c.memory.scope, c.memory.category)
            per_scope[key] = per_scope.get(key, 0) + request.count_tokens(line(c.memory, now=now))
        usage = Usage(
            ts=now,
            owner=owner,
            agent=agent,
            budget_profile=budget_name,
            retrieval_profile=result.profile,
            complexity=tier,
            budget=decision.tokens,
            tokens_loaded=sum(per_scope.values()),
            tokens_injected=result.tokens,
            per_scope=per_scope,
        )
        if not request.dry_run:
            store.monitor.record(usage)
            if result.chosen:
                store.touch_once(owner, turn.key, [c.memory.id for c in result.chosen])
        report = RecallReport(
            requested=requested,
            applied=result.profile,
            reason=result.reason,
            candidates=len(result.candidates),
            injected=len(result.chosen),
            dropped=tuple((c.memory.id, why) for c, why in result.dropped),
            chars=result.chars,
            max_chars=request.max_chars,
            tokens=result.tokens,
            budget=decision,
            usage=usage,
            bound_by=result.bound_by,
            scopes=result.scopes,
            too_common=tuple(result.skipped),
            hop_words=tuple(result.hop_words),
            placement=cfg.placement,
            memories=tuple({"id": c.memory.id, **c.signals()} for c in result.chosen),
            rewrite=request.rewrite_note,
            dry_run=request.dry_run,
        )
        return RecallResult(
            lines=tuple(line(c.memory, now=now) for c in result.chosen), report=report
        )

    def _complexity(self, query: str, request: RecallRequest, agent: str) -> tuple[Complexity, str]:
        if request.complexity is not None:
            return request.complexity, "x-context-budget-complexity header"
        tier, why = detect_complexity(query)
        if not request.dry_run and self.store.monitor.take_bump(request.owner, agent):
            return bump(tier), why + "; bumped a tier: the agent's last request exceeded its budget"
        return tier, why
