"""The pipeline's prune stage: when to prune a session's stale tool results, and that a
result once pruned goes out the same way for the rest of its conversation.

The clamp reports the results pruning could take (segments of action `prunable`,
`caps/prune.py`). This stage

1. reads the conversation's decisions (`proxy/report/ledger.py`: every worker and instance
   shares them), which apply on every request whatever the mode, each only to the result it
   was taken for (its digest, `caps.prune.digest`);
2. decides whether to prune the rest now: `cache-ttl` when the session's cache has expired
   anyway (its previous request is older than the cache's lifetime), `pays` also in a warm
   session when the reads it saves outweigh the rewrite (`caps.pays`; the rule and its
   derivation: `docs/pruning.md`);
3. applies them all in one second pass over the request (`WireRequest.prune`), and keeps the
   new decisions (first writer wins).

It runs with the budget on, for requests that generate (not token counting). The session's
clock is the pipeline's (`ProxyState.clock`): its previous request's time and its warm run.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from caps import Segment, pays
from memory.pg import DatabaseUnavailable
from proxy.cache.sessions import ClientPrefix, Digested, SessionTracker
from proxy.config.settings import Settings
from proxy.pipeline.summaries import Summarizer, summary_text
from proxy.report.billing import write_price
from proxy.report.ledger import Decisions, PruneLedger
from proxy.report.prices import prices
from proxy.wire.types import WireRequest

log = logging.getLogger("ctxbudget.prune")
_T = TypeVar("_T")

DATABASE_DOWN = (
    "the database did not answer: the decisions this process holds were applied and no new "
    "prune was taken (the database is skipped at once until a background check sees it again)"
)
"""Why a request with prunable results was not pruned anew (the report's `pruneSkipped`)."""
DEFAULT_TTL = 300.0
"""The cache lifetime a session's warm run is counted against when pruning is off."""
HOUR_TTL = (b'"ttl":"1h"', b'"ttl": "1h"')
"""How a request asks Anthropic for the 1-hour cache (`cache_control.ttl`)."""


@dataclass(frozen=True)
class Pruned:
    """What the prune stage did for one request."""

    segments: tuple[Segment, ...] = ()
    """The results pruned (now, or as decided before)."""
    warm: bool = False
    """Whether the session's cache was still warm when the request came."""
    ttl: float = DEFAULT_TTL
    """The cache lifetime the request was measured against, seconds."""
    planned_bust: bool = False
    """A prune decided now moved the cached prefix of a warm session (`pays`)."""
    summarise: Callable[[], None] | None = None
    """Asks for the summaries of the request's long results that have none: to call once the
    request was answered (`contextPruning.summarize`), never for one the upstream refused."""
    skipped: str | None = None
    """Why no new prune could be taken (the database did not answer: the decisions held were
    applied), or None: the report's `pruneSkipped`, the `-pruning-skipped` header."""

    def blocks(self, prefix: ClientPrefix) -> frozenset[int]:
        """The prefix blocks holding a pruned result."""
        return frozenset(_block(prefix, s.message_index) for s in self.segments)


class PruneStage:
    """Decides and applies pruning, against the report database's ledger."""

    def __init__(
        self, ledger: PruneLedger, sessions: SessionTracker, summarizer: Summarizer
    ) -> None:
        self._ledger = ledger
        self._sessions = sessions
        self.summarizer = summarizer
        """Summaries of long results, to stand for them once pruned (opt-in)."""

    async def run(
        self,
        body: WireRequest,
        *,
        owner: str,
        session: str,
        prefix: ClientPrefix,
        prunable: Sequence[Segment],
        settings: Settings,
        apply: bool,
        now: float,
    ) -> Pruned:
        """Prune what is due in `body` (`prunable`: the clamp's `prunable` segments)."""
        pruning = settings.pruning
        ttl = pruning.ttl_seconds if pruning is not None else DEFAULT_TTL
        timing = self._sessions.timing(owner, session)
        if timing is not None and now - timing[0] > ttl:
            ttl = _ttl(body, ttl)  # apparently expired: unless the request asks for longer
        warm = timing is not None and now - timing[0] <= ttl
        if pruning is None or not apply or not prunable:
            # nothing prunable: no decision was taken in this conversation yet, and the
            # conversation is not named without its first prunable result (`_conversation`)
            return Pruned(warm=warm, ttl=ttl)
        conversation = _conversation(prefix, session, prunable)
        decided = self._ledger.known(owner, conversation)
        try:
            if prunable and self._ledger.down:  # skipped at once, not a connect timeout
                raise DatabaseUnavailable("the breaker is open")
            if decided is None:
                decided = await self._read(owner, conversation)
            fresh = [s for s in prunable if _key(s) not in decided]
            if fresh and not warm:
                # cold by this worker's clock: another worker or instance may have served the
                # session since; the report's database says when it last saw it
                last = await self._call(self._ledger.last_seen, owner, session)
                warm = last is not None and now - last <= ttl
                if last is None and timing is None:
                    fresh = []  # never seen anywhere: its first request, nothing cached
        except DatabaseUnavailable as exc:
            return await self._held(body, owner, conversation, exc, settings, warm, ttl)
        due = bool(fresh) and (
            not warm
            or (
                pruning.mode == "pays"
                and timing is not None
                and self._pays(body, prefix, fresh, timing[1], ttl)
            )
        )
        now_ids = frozenset(_key(s) for s in fresh) if due else frozenset()
        try:
            summaries, summarise = await self._summaries(
                owner, conversation, session, fresh, settings
            )
        except DatabaseUnavailable as exc:
            return await self._held(body, owner, conversation, exc, settings, warm, ttl)
        plan: dict[tuple[str, str], str | None] = {
            **decided,
            **{_key(s): _with_summary(s, summaries) for s in fresh if _key(s) in now_ids},
        }
        if not plan:
            return Pruned(warm=warm, ttl=ttl, summarise=summarise)
        caps = replace(settings.caps_for(owner), pruned=_pruned(plan), pruned_now=now_ids)
        segments = await body.prune(caps, settings.tool_names)
        if now_ids:
            made = {_key(s): s.clamped for s in segments if _key(s) in now_ids and s.clamped}
            try:
                kept = await asyncio.to_thread(self._ledger.add, owner, conversation, made, at=now)
            except DatabaseUnavailable as exc:
                # the request goes out pruned: the ledger holds the texts, to send the same
                # bytes next time and to write once the database answers
                self._ledger.failed(exc)
                kept = made
            if any(kept.get(i) != text for i, text in made.items()):
                log.info("another worker pruned conversation %s first: its texts stand", session)
        return Pruned(
            tuple(segments), warm, ttl, planned_bust=bool(now_ids) and warm, summarise=summarise
        )

    async def _held(
        self,
        body: WireRequest,
        owner: str,
        conversation: str,
        exc: DatabaseUnavailable,
        settings: Settings,
        warm: bool,
        ttl: float,
    ) -> Pruned:
        """The database does not answer: the decisions this process holds for the
        conversation are applied (its pruned results go out as before), none is taken."""
        if not self._ledger.breaker.down:
            self._ledger.failed(exc)
        decided = self._ledger.held(owner, conversation)
        segments: Sequence[Segment] = ()
        if decided:
            caps = replace(
                settings.caps_for(owner), pruned=_pruned(decided), pruned_now=frozenset()
            )
            segments = await body.prune(caps, settings.tool_names)
        return Pruned(tuple(segments), warm, ttl, skipped=DATABASE_DOWN)

    async def _summaries(
        self,
        owner: str,
        conversation: str,
        session: str,
        fresh: Sequence[Segment],
        settings: Settings,
    ) -> tuple[dict[str, str], Callable[[], None] | None]:
        """The summaries kept for `fresh` results, and what asks for the long ones without
        one (once the request is answered)."""
        pruning = settings.pruning
        if not fresh or pruning is None or pruning.summarize_model is None:
            return {}, None
        have = await self._call(self._ledger.summaries, owner, conversation)
        summarise = functools.partial(
            self.summarizer.ask,
            list(fresh),
            owner=owner,
            conversation=conversation,
            session=session,
            have=have,
            settings=settings,
        )
        return have, summarise

    async def _read(self, owner: str, conversation: str) -> Decisions:
        return await self._call(self._ledger.decisions, owner, conversation)

    async def _call(self, read: Callable[[str, str], _T], owner: str, key: str) -> _T:
        """`read(owner, key)`, from a thread when the ledger's database may wait."""
        if self._ledger.waits:
            return await asyncio.to_thread(read, owner, key)
        return read(owner, key)

    def _pays(
        self,
        body: WireRequest,
        prefix: ClientPrefix,
        fresh: Sequence[Segment],
        run: int,
        ttl: float,
    ) -> bool:
        """`caps.pays` for pruning `fresh` now, in a warm session whose run has had `run`
        requests before this one. Sizes in bytes stand for tokens on both sides."""
        found = prices(body.model)
        if found is None:
            return False
        saved = sum(max(0, s.before - s.after) for s in fresh)
        first = min(_block(prefix, s.message_index) for s in fresh)
        # the prefix the provider would read from its cache: everything but the newest block
        rewritten = sum(_size(d) for d in prefix.data[first:-1])
        return pays(
            saved,
            max(saved, rewritten),
            write=write_price(found, "1h" if ttl >= 3600 else "5m"),
            read=found.cache_read,
            expected=(run + 1) / 2,  # half the warm run so far, this request counted
        )


def _key(segment: Segment) -> tuple[str, str]:
    """What a decision on a prunable or pruned `segment` is filed under: its call id and its
    result's digest (both set on every such segment, `caps/prune.py`)."""
    return (segment.call_id or "", segment.digest or "")


def _pruned(plan: Mapping[tuple[str, str], str | None]) -> tuple[tuple[str, str, str | None], ...]:
    """`plan` as `Caps.pruned`."""
    return tuple((call_id, digest, text) for (call_id, digest), text in plan.items())


def _conversation(prefix: ClientPrefix, session: str, prunable: Sequence[Segment]) -> str:
    """The conversation pruning files the request's decisions under: its session, its first
    message (`ClientPrefix.conversation`) and its first prunable result's digest. Two runs of
    one task share a session and a first message (the same system prompt and task, no time
    stamp) and often their call ids (`call_0`, …): what their tools answered first tells
    them apart. That result stays the first prunable one for the rest of the conversation
    (results become prunable oldest first and stay so, the client resends it unchanged);
    a pruning policy that changes which it is starts the conversation's decisions afresh,
    as a policy change takes new decisions in any case."""
    first = min(prunable, key=lambda s: s.message_index)
    return f"{prefix.conversation(session)}/{(first.digest or '')[:16]}"


def _with_summary(segment: Segment, summaries: dict[str, str]) -> str | None:
    """What stands for a result pruned now: its summary when it has one (and that is
    shorter), else None (the policy's text, written in the second pass)."""
    found = summaries.get(segment.call_id or "")
    return None if found is None else summary_text(found, segment, segment.url)


def _ttl(body: WireRequest, ttl: float) -> float:
    """The cache lifetime of the request's session: the request's own when it asks for longer
    (1 hour for `cache_control.ttl: "1h"`, 24 hours for `prompt_cache_retention: "24h"`),
    else `ttl` (the config's `contextPruning.ttl`). Looking costs a scan of the body (~0.1 ms
    for 186 KB): asked only of a request whose session looks expired by `ttl`."""
    if body.get("prompt_cache_retention") == "24h":
        return max(ttl, 86_400.0)
    if any(marker in body.raw for marker in HOUR_TTL):
        return max(ttl, 3_600.0)
    return ttl


def _block(prefix: ClientPrefix, message_index: int) -> int:
    """The prefix block of message `message_index` (the last block when not found)."""
    for label in (f"messages[{message_index}]", f"input[{message_index}]"):
        found = prefix.index_of(label)
        if found is not None:
            return found
    return len(prefix.blocks) - 1


def _size(data: bytes | Digested) -> int:
    return data.size if isinstance(data, Digested) else len(data)
