"""Each session's cache mirror, in two copies, and what a request's answer says of it.

`proxy/cache/mirror.py` plays the providers' rules over blocks; this module feeds it a
session's requests (DESIGN.md, "The provider's cache, mirrored"):

- the **sent** copy gets the bytes ctxbudget forwarded: what the provider really holds;
- the **direct** copy gets the bytes the client sent: what it would hold without ctxbudget.

A request's blocks are the provider's own units (`mirror_blocks`) for Anthropic: each tool,
each system block, each content block of a message (it counts its 20-block lookback in them);
for OpenAI, which caches by tokens, not blocks, ours (tools, system, each message or item).
Tokens are the block's bytes times the session's `scale`, tokens per byte, which every answer
sets again from the provider's own count of its own prompt (an OpenAI session's blocks are laid
out at the scale of its first request for good: `SessionMirror.places`); the report prices the
classes again with each block at its own token count (`MirrorView.exact`); the answer also
corrects the sent copy (what the provider says it read is what it holds) and says how far the
mirror was off (`MirrorView.settle`: `mirrorDrift`). A large Anthropic body parsed in the
offload process comes as digests, without its breakpoints: it is not mirrored (its money is
estimated from the blocks ctxbudget moved, as before).

`Mirrors` keeps them per owner and session, bounded by an estimate of their bytes
(`KEEP_BYTES` in all): past it, the owner holding the most bytes loses its least recently used
mirror, so one key's flood of new sessions never pushes out another's. A session it lost is
mirrored again from its next request, cold (its first prediction reads nothing).
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, compress, count
from operator import is_not, itemgetter
from typing import Any, Literal, NamedTuple

import orjson

from ctxbudget.proxy.cache.blocks import Block, _data, _digest, _hash, marked, size_of
from ctxbudget.proxy.cache.layout import Layout, Part, lay_out, same_groups
from ctxbudget.proxy.cache.mirror import (
    MAX_BREAKPOINTS,
    AnthropicMirror,
    Lifetime,
    MirrorBlock,
    OpenAIMirror,
    Predicted,
    TokenClass,
)
from ctxbudget.proxy.cache.priced import MovedTokens, fresh, moved_tokens
from ctxbudget.proxy.cache.resent import RESENT, ChangedInPlace
from ctxbudget.proxy.cache.sessions import Moved

Provider = Literal["anthropic", "openai"]
KEEP_BYTES = 64 << 20
"""All sessions' mirrors together, estimated (`SessionMirror.weight`)."""
BYTES_PER_TOKEN = 4.0
"""The scale a session starts with, before an answer says its own."""
RELAY_SHARE = 0.01
"""An Anthropic session's blocks are counted again at an answer's scale when it is off the
one they are laid out at by more than this share (`SessionMirror.places`)."""
MISS_TOKENS = 1024
MISS_SHARE = 0.1
"""A read short of the prediction by more than both (tokens; share of the prompt) is a
miss: the provider no longer holds what the sent copy did."""
_ENTRY_BYTES = 120
"""What one stored entry costs Python, roughly: the weight of a mirror."""
_PART_BYTES = 120
"""What one provider block of a layout costs (`layout.Layout`: its new tokens and ends, the
slots of its columns; measured ~118 with tracemalloc)."""


class Groups(NamedTuple):
    """One copy of a request's provider blocks, grouped by our block (`mirror_groups`), with
    the objects they were made of: the next request of the session finds its unchanged
    blocks by them and takes their groups as they were (`mirror_groups`' `last`)."""

    labels: list[str]
    values: list[Any]
    """Each block's value (held: an object kept cannot be another's under the same id)."""
    groups: list[list[Part]]
    keys: list[bytes]
    """The prompt's digest after each group (the key the next part is chained to)."""
    same: int = 0
    """How many leading groups are `base`'s (the very lists, or equal ones)."""
    base: list[list[Part]] | None = None
    """The groups of the `last` they were made from (`lay_out` takes `same` of them from
    the layout of those)."""


def mirror_blocks(blocks: Sequence[Block], provider: Provider, *, sent: bool) -> list[Part] | None:
    """`(prefix digest, bytes, breakpoint lifetime)` of each provider block of a request, as
    forwarded (`sent`) or as the client sent it; None when a block is only known by its digest
    (a large body parsed in the offload process: no mirror for that request)."""
    found = mirror_groups(blocks, provider, sent=sent)
    return None if found is None else [part for group in found.groups for part in group]


def mirror_groups(
    blocks: Sequence[Block], provider: Provider, *, sent: bool, last: Groups | None = None
) -> Groups | None:
    """`mirror_blocks` grouped by our block (`groups[i]` is `blocks[i]`'s): where a change to
    one of ours falls among the provider's blocks.

    A part's digest chains the one before it (`_digest(before + its bytes)`), so a block that
    is the same object as in `last` (the session's previous request: `resent` and `history`
    hand back the objects they parsed before), after the same digest, has the same group:
    only the other blocks are serialised and hashed. An agent's request N+1 is request N and a
    turn; re-serialising every Anthropic block of a 300-turn history took ~10 ms a request.
    The run of blocks `last` had is found by one scan in C and its columns taken as slices:
    no label or value is read from a block of it (a block's label goes with its value: the
    tools and the system prompt are never a message's object).
    """
    # a `Block`'s value by place: a tuple's item, not an attribute looked up
    kept: list[Any] = list(map(itemgetter(2 if sent else 1), blocks))
    labels: list[str] = []
    groups: list[list[Part]] = []
    keys: list[bytes] = []
    key = b""
    old: list[Any] = last.values if last is not None else []
    top = min(len(blocks), len(old))
    i = 0
    same = 0  # leading groups equal to `last`'s (negative: `_leading`)
    while i < len(blocks):
        if last is not None and i < top and key == (last.keys[i - 1] if i else b""):
            # after the same digest: the run of blocks that are the very objects of the last
            # request keeps its groups (found in C, not a line a block)
            if i == 0:  # the first run (an agent's: its whole history): each list once
                run = next(compress(count(), map(is_not, kept, old)), top)
                labels, groups, keys = last.labels[:run], last.groups[:run], last.keys[:run]
            else:
                run = next(compress(count(i), map(is_not, kept[i:top], old[i:top])), top)
                labels += last.labels[i:run]
                groups += last.groups[i:run]
                keys += last.keys[i:run]
            if run > i:
                key = keys[-1]
                same = run if same == i else same
                i = run
                continue
            if blocks[i].label == last.labels[i] and _same(kept[i], old[i]):
                kept[i] = old[i]  # the same bytes (a slice of this body): its copy
                labels.append(last.labels[i])
                groups.append(last.groups[i])
                key = last.keys[i]
                keys.append(key)
                same = i + 1 if same == i else same
                i += 1
                continue
        if same == i and last is not None and i < len(last.groups):
            # made again below: still leading if it comes out equal (a new object, the same
            # bytes and breakpoints)
            same = -i - 1
        label, value = blocks[i].label, kept[i]
        labels.append(label)
        if isinstance(value, bytearray | memoryview):
            # a slice of the body (a field passed on unread) is kept as a copy: the slice
            # would hold its whole body
            kept[i] = _Slice(value)
        i += 1
        if provider == "openai":
            # no breakpoints to find: our blocks as they are, whether this process parsed
            # them or the offload process hashed them (`Digested`: the same digest and size)
            data = _data(value)
            key = _digest(key + _hash(data))
            groups.append([(key, size_of(data), None)])
            keys.append(key)
            same = _leading(same, groups, last)
            continue
        if not marked(value):  # no breakpoints to find
            return None
        group: list[Part] = []
        for part in _parts(label, value, provider):
            ttl = _lifetime(part)
            data = _bytes(part)
            key = _digest(key + data)
            group.append((key, len(data), ttl))
        groups.append(group)
        keys.append(key)
        same = _leading(same, groups, last)
    if last is None:
        return Groups(labels, kept, groups, keys)
    return Groups(labels, kept, groups, keys, max(same, 0), last.groups)


def _check_groups(
    blocks: Sequence[Block], provider: Provider, sent: Groups | None, direct: Groups | None
) -> None:
    """`CTXBUDGET_CHECK_RESENT`: the groups taken from the session's previous request are
    those a pass over every block makes."""
    for found, as_sent in ((sent, True), (direct, False)):
        whole = mirror_groups(blocks, provider, sent=as_sent)
        if (found is None) != (whole is None) or (
            found is not None and whole is not None and found.groups != whole.groups
        ):
            raise ChangedInPlace("a session's mirror groups differ from a whole pass")


def _leading(same: int, groups: list[list[Part]], last: Groups | None) -> int:
    """`same` after a group made again: one more when it equals `last`'s (`same` is then
    `-(its index) - 1`: still leading up to it), else as it was."""
    if same >= 0 or last is None:
        return same
    i = -same - 1
    return i + 1 if groups[i] == last.groups[i] else i


def _same(value: Any, before: Any) -> bool:
    """Whether a block's value is the one the session's previous request had: the same
    object (parsed once: `resent`, `history`), or the same bytes (a field passed on unread,
    `tools`: a slice of each body, compared at memcmp speed)."""
    if value is before:
        return True
    if isinstance(value, bytearray | memoryview):
        return isinstance(before, _Slice) and memoryview(before) == value
    # bytes are read as they are, a slice without its `cache_control` (`serial`): not alike
    return type(value) is bytes and type(before) is bytes and value == before


class _Slice(bytes):
    """A copy of a slice a block's value was (`_same`)."""


def _parts(label: str, value: Any, provider: Provider) -> list[Any]:
    """The provider's blocks in one of ours: tools one by one; Anthropic's system and message
    content block by block."""
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            return [bytes(value)]
    if label == "tools" and isinstance(value, list):
        return value
    if provider == "anthropic":
        if label == "system" and isinstance(value, list):
            return value
        if isinstance(value, dict) and isinstance(value.get("content"), list):
            role = value.get("role")
            return [{"role": role, **p} if isinstance(p, dict) else p for p in value["content"]]
    return [value]


def _lifetime(part: Any) -> Lifetime | None:
    control = part.get("cache_control") if isinstance(part, dict) else None
    if not control:
        return None
    return "1h" if isinstance(control, dict) and control.get("ttl") == "1h" else "5m"


def _bytes(part: Any) -> bytes:
    """A block's bytes without its breakpoint marker (moving a marker keeps the prefix)."""
    if isinstance(part, bytes):
        return part
    if isinstance(part, dict) and "cache_control" in part:
        part = {k: v for k, v in part.items() if k != "cache_control"}
    try:
        return orjson.dumps(part)
    except TypeError:  # a lone surrogate, an integer past 64 bits: counted by its repr
        return repr(part).encode(errors="replace")


@dataclass
class MirrorView:
    """What the mirror predicted for one request, settled by its answer (`settle`)."""

    session: SessionMirror
    provider: Provider
    sent: Predicted
    """The forwarded request, in the session's estimated tokens."""
    direct: Predicted
    """The client's own request, in the same tokens."""
    written: Sequence[bytes] = ()
    """The sent copy's prefix digests this request holds afterwards."""
    counted: bool = False
    """Its bill is in the session's running totals (`count`)."""
    laid: tuple[Layout, Layout] | None = None
    """Where each of our blocks lies in the request as sent, then as the client sent it, in
    estimated tokens (`exact`)."""
    sent_bytes: int = 0
    """Bytes of this request as forwarded: its answer's tokens a byte are its own (a stream's
    answer is settled on the writer thread, often after the next request was mirrored)."""

    def exact(
        self, counted: dict[int, tuple[int, int]], total: int
    ) -> tuple[dict[TokenClass, float], dict[TokenClass, float]] | None:
        """The prompt's tokens by class as sent and as the client sent it, each of our blocks
        at its own token count, not at the session's one bytes-to-tokens scale: those in
        `counted` (index → (client's tokens, forwarded tokens): the blocks the report counts,
        those ctxbudget changed) as counted, the others at what the provider's `total` leaves
        for them. A pruned or clamped result is not as dense as a system prompt: at one scale
        its tokens, and with them what the client's bytes would have read, were off by
        several percent (issue 31). None when nothing is left for the others.

        Each class is its counted blocks' tokens in it, each at its own scale, and the rest
        of its stretch at the one density: the work is the counted blocks and the classes'
        stretches, not a line a block of the history."""
        if self.laid is None:
            return None
        sent, direct = self.laid
        if not sent.keys or not direct.keys:
            return None
        order = sorted(counted)
        mine, starts, stops = sent.spans(order)
        known = sum(_pick(counted, mine, 1))
        rest = sent.total - (sum(stops) - sum(starts))
        if rest > 0:
            density = (total - known) / rest
            if density <= 0:
                return None
        else:
            density = 1.0  # every block counted: nothing at the density
        theirs, their_starts, their_stops = direct.spans(order)
        return (
            sent.classes(starts, stops, _pick(counted, mine, 1), density, self.sent),
            direct.classes(their_starts, their_stops, _pick(counted, theirs, 0), density,
                           self.direct),
        )  # fmt: skip

    def count(self, billed: float, direct: float) -> None:
        """Add the request's bill and its direct counterpart to the session's totals, once."""
        if not self.counted:
            self.counted = True
            self.session.priced(billed, direct)

    def settle(self, read: int, total: int) -> tuple[float, int]:
        """The provider answered: it read `read` of `total` prompt tokens. Returns the scale
        from estimated to billed tokens for this request, and the drift: the provider's read
        less the mirror's (billed tokens; 0 when it was right)."""
        ratio = total / self.sent.total if self.sent.total > 0 else 1.0
        drift = read - round(self.sent.read * ratio)
        self.session.answered(self, total, drift)
        return ratio, drift


def _pick(counted: dict[int, tuple[int, int]], groups: list[int], side: int) -> list[int]:
    """`counted[g][side]` of each of `groups` (in C)."""
    return list(map(itemgetter(side), map(counted.__getitem__, groups)))


@dataclass
class SessionMirror:
    """One session's cache, as the provider holds it (`sent`) and as it would without
    ctxbudget (`direct`)."""

    provider: Provider
    sent: AnthropicMirror | OpenAIMirror
    direct: AnthropicMirror | OpenAIMirror
    scale: float = 1 / BYTES_PER_TOKEN
    """Billed tokens per byte of this session's blocks (the last answer's)."""
    sent_bytes: int = 0
    """Bytes of the newest request as forwarded (what `scale` is set from)."""
    laid_scale: float | None = None
    """The `scale` the session's blocks are laid out at (`places`): an OpenAI session's
    first, for good; an Anthropic session's until an answer moves it past `RELAY_SHARE`."""
    requests: int = 0
    """Requests mirrored so far."""
    warm_pruned: int = -2
    """The number (0 first) of the request that last took a warm prune."""
    unread: int = 0
    """Warm requests of the client's own stream (the direct copy) that did not read the entry
    their predecessor wrote at its last breakpoint: Claude Code marks a new prompt as a block
    list, then resends it as a plain string, so what a request writes there is never read and
    the next one writes again from the entry before (`PruneStage._pays` prices a rewrite
    twice in such a session)."""
    last_mark: bytes | None = None
    """The direct copy's newest request's last breakpoint (its prefix digest), or None."""
    last_mark_at: int = -1
    """Where `last_mark` was in that request (its block's index)."""
    billed_usd: float = 0.0
    """What the provider billed this session's priced requests through ctxbudget."""
    direct_usd: float = 0.0
    """What the same requests would have been billed sent direct (the report's
    `withoutCtxbudgetUsd`: the direct copy's prediction where results are pruned)."""
    last: tuple[Groups, Groups] | None = field(default=None, repr=False)
    """The newest request's blocks as forwarded and as sent (`mirror_groups`' `last`)."""
    seen: float | None = None
    """When the newest request it mirrored came (a request it could not mirror, a large body
    parsed elsewhere, leaves it behind the session: pruning does not price on it)."""
    settling: asyncio.Future[Any] | None = field(default=None, repr=False)
    """The newest streamed answer's settling (`Recorder.settle`), while it runs in a thread:
    pruning waits for it before deciding the session's next request."""
    layouts: tuple[Layout, Layout] | None = field(default=None, repr=False)
    """The newest request's provider blocks by column, each copy (`lay_out`'s `last`)."""
    moved: MovedTokens | None = field(default=None, repr=False)
    """The tokens of the blocks the newest priced request moved (`priced.moved_tokens`): the
    next request's report counts only the blocks it moves beyond them. Under `lock`."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def new(cls, provider: Provider) -> SessionMirror:
        if provider == "anthropic":
            return cls(provider, AnthropicMirror(), AnthropicMirror())
        return cls(provider, OpenAIMirror(), OpenAIMirror())

    @property
    def places(self) -> float:
        """Tokens per byte the blocks are laid out at (`laid_scale`; `scale` before the first
        request). OpenAI keeps prefixes by token position, and the mirror keys each step by
        the block it ends in and its position: at each answer's new scale the same history's
        steps moved, and the direct copy, which no answer corrects, found none of what it held
        (a whole prompt priced as uncached after a prune changed the sent prompt's density).
        So an OpenAI session keeps the scale its first request was laid out at: not its first
        answer's, which a stream's answer sets on the writer thread some requests later,
        moving every step once (issue 31: OpenClaw Responses' counterfactual 5% above the
        direct bill). The steps are then off the provider's by the scale's error, at most a
        step where a read ends: the report prices the classes again from the provider's own
        count (`exact`).

        Anthropic keys entries by block only, so its layout follows the answers' scale, but
        not each answer's: every answer moves it a little (a turn's bytes are a small part of
        a long prompt, not of its density), and counting every block of a 300-turn history
        again at each new scale was most of what a request's mirror cost at turn 300
        (issue 34). It is laid out again when an answer moves the scale past `RELAY_SHARE`
        of the one it is laid at: its token counts are off by less than that, which moves
        a breakpoint across the minimum a cache entry needs only within that share, and
        what the report prices is scaled to the provider's own count (`settle`, `exact`)."""
        laid = self.laid_scale
        if laid is None:
            return self.scale
        if self.provider == "anthropic" and abs(self.scale - laid) > RELAY_SHARE * laid:
            return self.scale
        return laid

    @property
    def weight(self) -> int:
        # and the newest request's objects it holds (`last`), by their bytes as forwarded:
        # while the conversation goes on `history` holds most of them too; and its layouts
        laid = sum(len(layout.keys) for layout in self.layouts or ())
        held = len(self.sent) + len(self.direct)
        moved = self.moved.weight if self.moved is not None else 0
        return 512 + _ENTRY_BYTES * held + _PART_BYTES * laid + self.sent_bytes + moved

    def moved_tokens(
        self,
        moved: Sequence[Moved],
        count: Callable[[bytes], int],
        late: Mapping[str, int],
        encoding: str,
    ) -> list[tuple[int, int]]:
        """The tokens of a request's moved blocks as the client sent them and as forwarded
        (`priced.moved_tokens`): those the session's previous priced request moved too taken
        as it counted them, the others counted; kept for the next request."""
        with self.lock:
            last = self.moved
        found = moved_tokens(moved, count, late, last, encoding)
        if RESENT.check and last is not None:  # what was carried must be what a count gives
            whole = moved_tokens(moved, count, late, None, encoding)
            if whole.tokens != found.tokens:
                raise ChangedInPlace("a session's moved blocks count otherwise than last time")
        with self.lock:
            self.moved = found
        return found.tokens

    def uncounted(self, moved: Sequence[Moved], encoding: str) -> list[int]:
        """Which of `moved`'s blocks the session's previous priced request did not count
        (`moved_tokens` takes the others' counts from it)."""
        with self.lock:
            last = self.moved
        return fresh(moved, last, encoding)

    def observe(
        self,
        sent: Sequence[Part],
        direct: Sequence[Part],
        *,
        now: float,
        model: str,
        retention: str | None = None,
        sizes: tuple[Sequence[int], Sequence[int]] | None = None,
    ) -> MirrorView:
        """Both copies billed for one request at `now`; each then holds what it wrote.
        `sizes`: how many of `sent`'s and `direct`'s blocks each of ours has, in order
        (`MirrorView.exact`)."""
        return self.observe_groups(
            Groups([], [], _grouped(sent, sizes[0] if sizes is not None else None), []),
            Groups([], [], _grouped(direct, sizes[1] if sizes is not None else None), []),
            now=now,
            model=model,
            retention=retention,
            priced=sizes is not None,
        )

    def observe_groups(
        self,
        sent: Groups,
        direct: Groups,
        *,
        now: float,
        model: str,
        retention: str | None = None,
        priced: bool = True,
    ) -> MirrorView:
        """`observe` of the provider blocks grouped by our block (`mirror_groups`). The
        leading groups the newest request had are laid out as they were (`lay_out`): a
        request that goes on from it costs what it adds, not its history."""
        with self.lock:
            scale = self.laid_scale = self.places
            last = self.layouts
            sent_laid = _lay_out(sent, scale, last[0] if last is not None else None)
            direct_laid = _lay_out(direct, scale, last[1] if last is not None else None)
            self.layouts = (sent_laid, direct_laid)
            self.sent_bytes = sent_laid.size
            self.requests += 1
            self.seen = now
            billed_direct = self._bill(self.direct, direct_laid, now, model, retention)
            if self.provider == "anthropic":
                self._reread(direct_laid, billed_direct)
            marks = sent_laid.marks
            return MirrorView(
                self,
                self.provider,
                self._bill(self.sent, sent_laid, now, model, retention),
                billed_direct,
                sent_laid.keys  # not copied: a layout's columns are never changed after
                if self.provider == "openai"
                else tuple(sent_laid.keys[i] for i in marks),
                laid=(sent_laid, direct_laid) if priced else None,
                sent_bytes=self.sent_bytes,
            )

    def _reread(self, blocks: Layout, billed: Predicted) -> None:
        """Count a warm direct request that did not read its predecessor's last breakpoint
        (`unread`), and keep its own. Under the lock."""
        last = self.last_mark
        marks = blocks.marks[:MAX_BREAKPOINTS]
        self.last_mark = blocks.keys[marks[-1]] if marks else None
        if last is None or billed.read <= 0:
            return  # the first request, or cold: nothing was there to read
        # where it was (a conversation goes on: the same place), else the first of that digest
        at = self.last_mark_at
        self.last_mark_at = marks[-1] if marks else -1
        if not (0 <= at < len(blocks.keys) and blocks.keys[at] == last):
            try:
                at = blocks.keys.index(last)
            except ValueError:
                self.unread += 1
                return
        if blocks.ends[at + 1] > billed.read:
            self.unread += 1

    @staticmethod
    def _bill(
        mirror: AnthropicMirror | OpenAIMirror,
        blocks: Layout,
        now: float,
        model: str,
        retention: str | None,
    ) -> Predicted:
        if isinstance(mirror, AnthropicMirror):
            return mirror.bill_parts(
                blocks.keys, blocks.tokens, blocks.ttls, now=now, model=model,
                ends=blocks.ends, marks=blocks.marks,
            )  # fmt: skip
        return mirror.bill_parts(
            blocks.keys, blocks.tokens, now=now, retention=retention, ends=blocks.ends
        )

    def what_if(self, blocks: Sequence[MirrorBlock], *, now: float, model: str,
                retention: str | None = None) -> Predicted:  # fmt: skip
        """What the provider would bill a request of `blocks` at `now`, the mirror unchanged."""
        with self.lock:
            if isinstance(self.sent, AnthropicMirror):
                return self.sent.bill(blocks, now=now, model=model, keep=False)
            return self.sent.bill(blocks, now=now, retention=retention, keep=False)

    def priced(self, billed: float, direct: float) -> None:
        """Add one answered request's bill and its direct counterpart to the running totals."""
        with self.lock:
            self.billed_usd += billed
            self.direct_usd += direct

    def paused(self) -> str | None:
        """Why warm pruning is stopped for this session, or None: the guard on the measured
        bill (DESIGN.md: a session never stays in the red because of us). A warm prune pays
        its rewrite at once and is repaid by the reads of later requests; until the bill is
        back at or under direct, no other one is taken (a cold prune, free, still is)."""
        with self.lock:
            billed, direct = self.billed_usd, self.direct_usd
        # a cent's fraction: the direct side is a prediction in whole tokens
        if billed <= direct + 1e-6:
            return None
        return (
            f"billed ${billed:.4f} through ctxbudget, ${direct:.4f} direct (the cache mirror): "
            "no warm prune until the reads it saves repay the rewrite; cold prunes go on"
        )

    def answered(self, view: MirrorView, total: int, drift: int) -> None:
        """Correct the mirror by an answer: the scale from its token count, and — when the
        provider read less than the sent copy expected — the copy forgets what it held from
        before (the provider no longer has it)."""
        with self.lock:
            if view.sent_bytes > 0 and total > 0:
                self.scale = total / view.sent_bytes
            # a token count estimated from bytes is off by a few percent: only a read well
            # short of the prediction says the provider lost what it held
            if view.sent.read > 0 and -drift > max(MISS_TOKENS, MISS_SHARE * total):
                self.sent.forget_before(view.written)


def _lay_out(groups: Groups, scale: float, last: Layout | None) -> Layout:
    """`lay_out` of one copy: `mirror_groups` says how many leading groups are those of the
    request it compared with; when that is `last`'s (no other request of the session came
    between), they are not compared again."""
    if last is not None and groups.base is last.groups:
        return lay_out(groups.groups, scale, last, same=groups.same)
    return lay_out(groups.groups, scale, last, same=same_groups(groups.groups, last))


def _grouped(parts: Sequence[Part], sizes: Sequence[int] | None) -> list[list[Part]]:
    """`parts` in groups of `sizes` each (one each without)."""
    if sizes is None:
        return [[part] for part in parts]
    ends = list(accumulate(sizes, initial=0))
    return [list(parts[ends[i] : ends[i + 1]]) for i in range(len(sizes))]


class _Kept:
    """The mirrors per owner, each owner's least recent first, `keep_bytes` in all (each
    mirror's weight as it was last stored): past it, the owner holding the most bytes loses
    its least recent mirror, so one key's flood of new session ids pushes out its own, never
    another's (one shared LRU let any key holder push out everyone's). Which owners hold a
    session of each id is indexed (`Mirrors.paused`). Not locked: `Mirrors` locks."""

    def __init__(self, keep_bytes: int) -> None:
        self._keep = keep_bytes
        self._owners: dict[str, OrderedDict[str, tuple[SessionMirror, int]]] = {}
        self._bytes: dict[str, int] = {}
        self._total = 0
        self.owners: dict[str, set[str]] = {}

    def get(self, owner: str, session: str) -> SessionMirror | None:
        mirrors = self._owners.get(owner)
        if mirrors is None or (found := mirrors.get(session)) is None:
            return None
        mirrors.move_to_end(session)
        return found[0]

    def put(self, owner: str, session: str, mirror: SessionMirror) -> None:
        weight = mirror.weight
        if weight > self._keep:  # one mirror larger than them all: not kept
            # nor left at its old weight, when it was kept small and grew in place
            if session in self._owners.get(owner, {}):
                self._owners[owner].move_to_end(session, last=False)
                self._evict(owner)
            return
        mirrors = self._owners.setdefault(owner, OrderedDict())
        old = mirrors.pop(session, None)
        held = self._bytes.get(owner, 0) - (0 if old is None else old[1]) + weight
        self._total += weight - (0 if old is None else old[1])
        mirrors[session] = (mirror, weight)
        self._bytes[owner] = held
        self.owners.setdefault(session, set()).add(owner)
        while self._total > self._keep:
            most = max(self._bytes, key=self._bytes.__getitem__)
            # on a tie, the owner whose mirror went over gives way
            self._evict(owner if self._bytes[owner] >= self._bytes[most] else most)

    def _evict(self, owner: str) -> None:
        mirrors = self._owners[owner]
        session, (_, weight) = mirrors.popitem(last=False)
        self._total -= weight
        self._bytes[owner] -= weight
        if not mirrors:
            del self._owners[owner], self._bytes[owner]
        holders = self.owners[session]
        holders.discard(owner)
        if not holders:
            del self.owners[session]


class Mirrors:
    """Every session's `SessionMirror`, by owner and session, bounded by `keep_bytes` (per
    owner, as `_Kept` says)."""

    def __init__(self, keep_bytes: int = KEEP_BYTES) -> None:
        self._kept = _Kept(keep_bytes)
        self._lock = threading.Lock()

    def observe(
        self,
        owner: str,
        session: str,
        provider: Provider,
        blocks: Sequence[Block],
        *,
        now: float,
        model: str,
        retention: str | None = None,
    ) -> MirrorView | None:
        """Feed both copies of `owner`'s `session` with a request (`blocks`: ours, each as the
        client sent it and as forwarded); None when the request cannot be mirrored."""
        with self._lock:
            mirror = self._kept.get(owner, session)
            if mirror is None or mirror.provider != provider:
                mirror = SessionMirror.new(provider)
        last = mirror.last  # one tuple: a request of the session beside this one swaps it whole
        sent_groups = mirror_groups(
            blocks, provider, sent=True, last=last[0] if last is not None else None
        )
        direct_groups = mirror_groups(
            blocks, provider, sent=False, last=last[1] if last is not None else None
        )
        if RESENT.check and last is not None:  # what was taken must be what a whole pass makes
            _check_groups(blocks, provider, sent_groups, direct_groups)
        if sent_groups is None or direct_groups is None:
            return None
        if not any(sent_groups.groups):
            return None
        mirror.last = (sent_groups, direct_groups)
        view = mirror.observe_groups(
            sent_groups, direct_groups, now=now, model=model, retention=retention
        )
        with self._lock:
            self._kept.put(owner, session, mirror)  # again: its weight grew
        return view

    def get(self, owner: str, session: str) -> SessionMirror | None:
        with self._lock:
            return self._kept.get(owner, session)

    def paused(self, owner: str | None, session: str) -> str | None:
        """Why warm pruning is stopped for `owner`'s `session` in this process (any owner's
        session of that id when `owner` is None: the admin's report), or None."""
        with self._lock:
            # by key, never a walk over every mirror: one key's new session ids make up to
            # 131,072 of them, and the report asks this for each session it shows
            owners = sorted(self._kept.owners.get(session, ())) if owner is None else [owner]
            found = [m for o in owners if (m := self._kept.get(o, session)) is not None]
        return next((r for m in found if (r := m.paused()) is not None), None)
