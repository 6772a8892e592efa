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
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from ctxbudget.caps import Caps, Memo, Segment
from ctxbudget.memory.pg import DatabaseUnavailable
from ctxbudget.proxy.cache.mirror import MirrorBlock, Predicted
from ctxbudget.proxy.cache.mirrors import Mirrors, Provider, SessionMirror, mirror_groups
from ctxbudget.proxy.cache.prefix import ClientPrefix
from ctxbudget.proxy.cache.resent import RESENT, ChangedInPlace
from ctxbudget.proxy.cache.sessions import SessionTracker
from ctxbudget.proxy.config.settings import Settings
from ctxbudget.proxy.pipeline.summaries import Summarizer, summary_text
from ctxbudget.proxy.pipeline.work import Work
from ctxbudget.proxy.report.billing import write_price
from ctxbudget.proxy.report.ledger import Decisions, PruneLedger
from ctxbudget.proxy.report.prices import Prices, prices
from ctxbudget.proxy.wire.conversations import same_prefix
from ctxbudget.proxy.wire.types import WireRequest

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
    paused: str | None = None
    """Why warm pruning is stopped for the session (its bill is above direct), or None."""
    skipped: str | None = None
    """Why no new prune could be taken (the database did not answer: the decisions held were
    applied), or None: the report's `pruneSkipped`, the `-pruning-skipped` header."""

    def blocks(self, prefix: ClientPrefix) -> frozenset[int]:
        """The prefix blocks holding a pruned result."""
        return frozenset(_block(prefix, s.message_index) for s in self.segments)


class PruneStage:
    """Decides and applies pruning, against the report database's ledger."""

    def __init__(
        self,
        ledger: PruneLedger,
        sessions: SessionTracker,
        summarizer: Summarizer,
        mirrors: Mirrors | None = None,
        memo: Memo | None = None,
    ) -> None:
        self._memo = memo
        """The app's (`ProxyState.memo`): what applying decisions reads is remembered there."""
        self._ledger = ledger
        self._sessions = sessions
        self._mirrors = mirrors if mirrors is not None else Mirrors()
        self.summarizer = summarizer
        """Summaries of long results, to stand for them once pruned (opt-in)."""

    async def run(
        self,
        work: Work,
        *,
        owner: str,
        session: str,
        prefix: ClientPrefix,
        prunable: Sequence[Segment],
        settings: Settings,
        apply: bool,
        now: float,
        provider: Provider = "openai",
    ) -> Pruned:
        """Prune what is due in `work`'s body (`prunable`: the clamp's `prunable` segments)."""
        body = work.body
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
            # none decided yet (a conversation never pruned): every one is fresh, unread
            fresh: Sequence[Segment] = _undecided(work, prunable, decided) if decided else prunable
            if fresh and not warm:
                # cold by this worker's clock: another worker or instance may have served the
                # session since; the report's database says when it last saw it
                last = await self._call(self._ledger.last_seen, owner, session)
                if decided:
                    # a prune is a request of the session too, its decisions written before
                    # it went upstream: the report's writer may not have written it yet
                    # (another worker just pruned after the gap: warm again since)
                    at = await self._call(self._ledger.pruned_at, owner, conversation)
                    last = at if last is None or (at is not None and at > last) else last
                warm = last is not None and now - last <= ttl
                if last is None and timing is None:
                    fresh = []  # never seen anywhere: its first request, nothing cached
        except DatabaseUnavailable as exc:
            return await self._held(work, owner, conversation, exc, settings, warm, ttl)
        segments: list[Segment] = []
        paused: str | None = None
        due = bool(fresh) and not warm  # a cold cache: the prune is free
        if fresh and warm and pruning.mode == "pays" and timing is not None:
            mirror = self._mirrors.get(owner, session)
            if mirror is not None and mirror.seen != timing[0]:
                mirror = None  # it missed the session's newest request: behind what is cached
            settling = mirror.settling if mirror is not None else None
            if settling is not None and not settling.done():
                # the previous answer's usage, priced in a thread: decided on it, whenever the
                # thread gets there (`Recorder.settle`), so a replay decides the same
                await asyncio.wait([settling])
            paused = mirror.paused() if mirror is not None else None
            # an instance without the session's mirror has nothing to price a rewrite on;
            # a prune on the turn after one waits: the next result joins the batch for the
            # price of one turn's reads, instead of a second whole rewrite
            if mirror is not None and paused is None and mirror.warm_pruned < mirror.requests - 1:
                if decided:  # the request as it goes without a new prune: what is priced
                    segments = await work.prune(
                        _plan(settings, owner, decided), settings.tool_names, self._memo
                    )
                    decided = {}
                due = self._pays(body, prefix, fresh, mirror, provider, ttl, now, timing[1])
                if due:
                    mirror.warm_pruned = mirror.requests
        now_ids = frozenset(_key(s) for s in fresh) if due else frozenset()
        try:
            summaries, summarise = await self._summaries(
                owner, conversation, session, fresh, settings
            )
        except DatabaseUnavailable as exc:
            return await self._held(work, owner, conversation, exc, settings, warm, ttl)
        plan: dict[tuple[str, str], str | None] = dict(decided)
        if now_ids:  # none pruned now (a warm session): the results are not read
            plan.update({_key(s): _with_summary(s, summaries) for s in fresh if _key(s) in now_ids})
        if not plan and not segments:
            return Pruned(warm=warm, ttl=ttl, summarise=summarise, paused=paused)
        if plan:
            segments += await work.prune(
                _plan(settings, owner, plan, now_ids), settings.tool_names, self._memo
            )
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
            tuple(segments),
            warm,
            ttl,
            planned_bust=bool(now_ids) and warm,
            summarise=summarise,
            paused=paused,
        )

    async def _held(
        self,
        work: Work,
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
            caps = _plan(settings, owner, decided)
            segments = await work.prune(caps, settings.tool_names, self._memo)
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
        mirror: SessionMirror,
        provider: Provider,
        ttl: float,
        now: float,
        run: int,
    ) -> bool:
        """Whether pruning `fresh` now, in a warm session whose run has had `run` requests
        before this one, costs less than keeping them, priced on the session's cache mirror
        (`docs/pruning.md`, "When a warm prune pays"): this request billed pruned against
        billed intact — the provider reads up to the last intact stored entry and writes the
        rest again — against the reads the prune saves each later request of the run, over
        half the run so far."""
        found = prices(body.model)
        last = mirror.last
        found_groups = mirror_groups(
            body.blocks(), provider, sent=True, last=last[0] if last is not None else None
        )
        if found is None or found_groups is None:
            return False
        groups = found_groups.groups
        less: dict[int, int] = {}
        for s in fresh:
            at = _block(prefix, s.message_index)
            less[at] = less.get(at, 0) + max(0, s.before - s.after)
        scale = mirror.places
        intact: list[MirrorBlock] = []
        pruned: list[MirrorBlock] = []
        changed = False
        for index, group in enumerate(groups):
            cut = less.get(index, 0)
            changed = changed or cut > 0
            largest = max(range(len(group)), key=lambda i: group[i][1]) if group else -1
            for i, (key, size, life) in enumerate(group):
                intact.append(MirrorBlock(key, round(size * scale), life))
                if not changed:
                    pruned.append(intact[-1])
                    continue
                # every digest from the first pruned block on is new: the provider has none
                size = max(0, size - cut) if i == largest else size
                pruned.append(MirrorBlock(b"pruned:" + key, round(size * scale), life))
        retention = body.get("prompt_cache_retention")
        kept = retention if isinstance(retention, str) else None
        model = body.model or ""
        rewrite = _usd(mirror.what_if(pruned, now=now, model=model, retention=kept), found) - _usd(
            mirror.what_if(intact, now=now, model=model, retention=kept), found
        )
        if mirror.unread > 0:
            # the client does not always read what a request writes at its last breakpoint
            # (the direct copy saw it): the rewrite is written there now and, when this is
            # such a request, again by the next one from the entry before the change
            rewrite *= 2
        saved = sum(less.values()) * mirror.scale
        if saved <= 0:
            return False
        if rewrite <= 0:
            return True  # nothing to repay: this request costs no more pruned
        horizon = (run + 1) / 2  # half the warm run so far, this request counted
        # the rewrite is paid whether or not the session goes on: it is taken only out of
        # what the session has already saved against direct (measured, `SessionMirror`), so
        # a session that ends at the next request is still not billed above direct
        with mirror.lock:
            banked = mirror.direct_usd - mirror.billed_usd
        return horizon * saved * found.cache_read > rewrite and banked >= rewrite


@dataclass(frozen=True, slots=True)
class _Undecided:
    """The prunable results of a request that no decision was taken for, carried to the next
    request of its conversation (`Conversation.undecided`): never changed once made."""

    decided: Decisions
    prunable: Sequence[Segment]
    fresh: list[Segment]
    at: list[int]
    """Each of `fresh`'s place in `prunable`."""


def _undecided(work: Work, prunable: Sequence[Segment], decided: Decisions) -> list[Segment]:
    """The results of `prunable` without a decision in `decided`. A pruned conversation's
    prunable results grow with it, and the clamp hands the same segments again for the
    results a request repeats: with the same decisions as its last request, only the new
    ones are looked up (the first ones found the same by a C scan)."""
    last, own = work.body.states()
    known = last.undecided if last is not None else None
    start, fresh, at = 0, [], []
    if isinstance(known, _Undecided) and (known.decided is decided or known.decided == decided):
        start = same_prefix(prunable, known.prunable, len(prunable))
        kept = bisect_left(known.at, start)
        fresh, at = known.fresh[:kept], known.at[:kept]
    for i in range(start, len(prunable)):
        if _key(prunable[i]) not in decided:
            fresh.append(prunable[i])
            at.append(i)
    if RESENT.check and start and fresh != [s for s in prunable if _key(s) not in decided]:
        raise ChangedInPlace("a conversation's undecided prunable results were carried wrong")
    if own is not None:
        own.undecided = _Undecided(decided, prunable, fresh, at)
    return fresh


def _plan(
    settings: Settings,
    owner: str,
    plan: Mapping[tuple[str, str], str | None],
    fresh: frozenset[tuple[str, str]] = frozenset(),
) -> Caps:
    """The owner's caps that apply the decisions of `plan` (`fresh`: the ones taken now),
    each to the result it was taken for (call id and digest)."""
    return replace(settings.caps_for(owner), pruned=_pruned(plan), pruned_now=fresh)


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
    # the clamp reports them in message order: the first is the first (not read all)
    first = prunable[0]
    if RESENT.check and first is not min(prunable, key=lambda s: s.message_index):
        raise ChangedInPlace("the clamp's prunable results are not in message order")
    return f"{prefix.conversation(session)}/{(first.digest or '')[:16]}"


def _usd(bill: Predicted, found: Prices) -> float:
    """A prompt's price by token class (writes at their lifetime's price)."""
    return (
        bill.input * found.input
        + bill.read * found.cache_read
        + bill.write_5m * write_price(found, "5m")
        + bill.write_1h * write_price(found, "1h")
    )


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
