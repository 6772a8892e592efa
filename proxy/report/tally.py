"""What a request's segments add up to — each one's saved tokens and report entry, and their
sums by kind and action — carried from the previous request of its conversation (issue 34).

An agent's request N+1 resends request N's segments, the very objects (the clamp resumes
them: `caps.ClampState`), then a new one or two. Everything the headers, the report's entry,
its totals and the metrics read of a segment is worked once, when the segment is first seen,
and kept on the conversation's state (`Conversation.tally`): `tally(found, previous=)` takes
it for the segments `found` repeats of `previous` (compared by identity, in C: no Python per
segment) and works only the rest. Sums are carried by checkpoints every `STRIDE` segments, so
a request that repeats fewer than request N had (a result pruned since, OpenClaw's dropped
context message) adds back at most `STRIDE` old ones.

Each entry is JSON already (`Tally.fragments`), made once. The report stores a request's
segments in two parts (schema 10, `proxy/report/store.py`): every `CHUNK` segments from the
first make a chunk (`Tally.chunks`: their JSON, found by its digest), written once, when the
conversation's request that completes it is, and named by each later request that repeats
it (`requests.chunks`); the request's own row lists only the segments after its chunks. So a
request at turn 300 writes what one at turn 30 does (a 47 KB row, and SQLite's checkpoints of
it, had made the writer's cost grow with the history), and reading it joins the chunks back
in order (`proxy/report/summary.py` `with_chunks`): the entry read is the entry it was.

A tally is never changed once made: the next request's copies what it extends (two requests
may extend one conversation). With `CTXBUDGET_CHECK_RESENT=1` every carried tally is made
again whole and compared (`check`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import compress, count, islice
from operator import is_not
from typing import Any

import orjson
import xxhash

from ctxbudget.caps import Segment
from ctxbudget.caps.types import evolve

CHUNK = 32
"""Segments a stored chunk holds (`Tally.chunks`): a request's row holds fewer than this many
of its own (~300 bytes each)."""

STRIDE = 8
"""A checkpoint of the sums every this many segments (`Tally.checkpoints`): a request that
repeats fewer segments than the last one had (Messages: OpenClaw's cache marker moves off
the last request's newest result, so that item is new bytes) sums at most this many again."""

TALLY_BYTES_A_SEGMENT = 512
"""What a tally holds for each segment beyond the segment itself: its JSON entry (~300 bytes),
its token count and its slots in four tuples; weighed toward the conversations' bound."""

COUNT, BEFORE, AFTER, SAVED, TOKENS, USD = range(6)
"""The fields of one (kind, action)'s sums: segments, chars before and after, chars saved,
tokens saved, and their value at the input price (`savedUsd`, 0 when unpriced)."""

Sums = dict[tuple[str, str], list[Any]]
"""Per (kind, action): `[segments, before, after, saved, tokens, usd]`."""


class Tally:
    """One request's segments, as reported, with what the report reads of each and their
    sums (`tally`)."""

    __slots__ = (
        "key",
        "source",
        "segments",
        "tokens",
        "fragments",
        "sums",
        "pruned_now",
        "checkpoints",
        "chunks",
    )

    def __init__(
        self,
        key: tuple[Any, ...],
        source: tuple[Segment, ...],
        segments: tuple[Segment, ...],
        tokens: tuple[int, ...],
        fragments: tuple[bytes, ...],
        sums: Sums,
        pruned_now: int,
        checkpoints: tuple[tuple[Sums, int], ...],
        chunks: tuple[tuple[str, bytes], ...] = (),
    ) -> None:
        self.key = key
        """What the carried values hold for: the encoding, the owner, the input price and
        whether the budget was on."""
        self.source = source
        """The segments as the stages found them (matched by identity with the next)."""
        self.segments = segments
        """As reported: `clamped` ones `would-clamp` with the budget off."""
        self.tokens = tokens
        """Tokens each saved (or would save)."""
        self.fragments = fragments
        """Each segment's report entry, as JSON (`storable`)."""
        self.sums = sums
        self.pruned_now = pruned_now
        """Results pruned by this request (`pruned now`): the session's `prunes`."""
        self.checkpoints = checkpoints
        """`(sums, pruned_now)` of the first `j * STRIDE` segments, for each j."""
        self.chunks = chunks
        """Each whole `CHUNK` of the entries from the first: its digest, and its entries'
        JSON joined by commas."""

    def __len__(self) -> int:
        return len(self.source)

    def acted(self, action: str) -> tuple[int, int, int]:
        """Segments of `action` (`clamped`, `would-clamp`), their chars and tokens saved."""
        segments = chars = tokens = 0
        for (_, act), sums in self.sums.items():
            if act == action:
                segments += sums[COUNT]
                chars += sums[SAVED]
                tokens += sums[TOKENS]
        return segments, chars, tokens

    def by_kind(self, action: str) -> dict[str, list[Any]]:
        """Each kind's sums of the segments of `action` (the metrics' counters)."""
        return {kind: sums for (kind, act), sums in self.sums.items() if act == action}

    def json(self) -> bytes:
        """The segments' entries as one JSON list."""
        return b"[" + b",".join(self.fragments) + b"]"

    def tail(self) -> bytes:
        """The entries after the chunks (`chunks`) as one JSON list: what the request's
        own row holds."""
        return b"[" + b",".join(self.fragments[len(self.chunks) * CHUNK :]) + b"]"

    def kind_totals(self) -> dict[str, tuple[Any, ...]]:
        """Per kind, what the report's totals add (`totals_by_hour`): seen, clamped, would
        clamp, chars before and after, chars and tokens saved and that would be, and their
        value both ways."""
        out: dict[str, list[Any]] = {}
        for (kind, action), s in self.sums.items():
            row = out.get(kind)
            if row is None:
                row = out[kind] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
            row[0] += s[COUNT]
            row[3] += s[BEFORE]
            row[4] += s[AFTER]
            if action == "clamped":
                row[1] += s[COUNT]
                row[5] += s[SAVED]
                row[6] += s[TOKENS]
                row[9] += s[USD]
            elif action == "would-clamp":
                row[2] += s[COUNT]
                row[7] += s[SAVED]
                row[8] += s[TOKENS]
                row[10] += s[USD]
        return {kind: tuple(row) for kind, row in out.items()}


EMPTY = Tally((), (), (), (), (), {}, 0, (({}, 0),))
"""No segments (a request answered by the proxy itself, or one not clamped)."""


def tally(
    found: Sequence[Segment],
    *,
    key: tuple[Any, ...],
    enabled: bool,
    price: float | None,
    saved_tokens: Callable[[Segment], int],
    previous: Tally | None = None,
) -> Tally:
    """The tally of `found` (the stages' segments: `clamped` ones are reported `would-clamp`
    when not `enabled`), its tokens counted by `saved_tokens`: taken from `previous` for the
    segments it repeats (the very objects, first to last) when it holds for the same `key`
    (encoding, owner, price, enabled); the rest worked here."""
    source = tuple(found)
    kept = 0
    if previous is not None and previous.key == key:
        kept = _same_prefix(source, previous.source)
    if kept == 0:
        previous = None
    elif previous is not None and kept == len(previous) == len(source):
        return previous  # the very segments again (a request resent): never changed, shared
    new = source[kept:]
    reported = new if enabled else tuple(_would(s) for s in new)
    counted = tuple(saved_tokens(s) for s in reported)
    made = tuple(_fragment(s, n, price) for s, n in zip(reported, counted, strict=True))
    checkpoints: list[tuple[Sums, int]]
    if previous is None:
        segments, tokens, fragments = reported, counted, made
        start, sums, pruned_now, checkpoints = 0, {}, 0, [({}, 0)]
    else:
        segments = source if enabled else previous.segments[:kept] + reported
        tokens = previous.tokens[:kept] + counted
        fragments = previous.fragments[:kept] + made
        if kept == len(previous):  # the whole of it: on from its sums
            start, sums, pruned_now = kept, _copy(previous.sums), previous.pruned_now
            checkpoints = list(previous.checkpoints)
        else:  # on from the checkpoint before the first segment it does not repeat
            j = kept // STRIDE
            start = j * STRIDE
            sums, pruned_now = _copy(previous.checkpoints[j][0]), previous.checkpoints[j][1]
            checkpoints = list(previous.checkpoints[: j + 1])
    for i in range(start, len(segments)):
        s = segments[i]
        pruned_now += _add(sums, s, tokens[i], price)
        if (i + 1) % STRIDE == 0:
            checkpoints.append((_copy(sums), pruned_now))
    chunks = list(previous.chunks[: kept // CHUNK]) if previous is not None else []
    for c in range(len(chunks), len(fragments) // CHUNK):  # a chunk's JSON joined once
        data = b",".join(fragments[c * CHUNK : (c + 1) * CHUNK])
        chunks.append((xxhash.xxh3_128_hexdigest(data), data))
    return Tally(
        key,
        source,
        segments,
        tokens,
        fragments,
        sums,
        pruned_now,
        tuple(checkpoints),
        tuple(chunks),
    )


def check(made: Tally, whole: Tally) -> bool:
    """Whether a carried tally says what one made whole says (`CTXBUDGET_CHECK_RESENT`)."""
    return (
        made.segments == whole.segments
        and made.tokens == whole.tokens
        and made.fragments == whole.fragments
        and made.sums == whole.sums
        and made.pruned_now == whole.pruned_now
        and made.checkpoints == whole.checkpoints
        and made.chunks == whole.chunks
    )


def _add(sums: Sums, s: Segment, tokens: int, price: float | None) -> int:
    """Add `s` to `sums`; 1 when it is a result pruned now."""
    key = (s.kind, s.action)
    row = sums.get(key)
    if row is None:
        row = sums[key] = [0, 0, 0, 0, 0, 0]
    saved = s.saved
    row[COUNT] += 1
    row[BEFORE] += s.before
    row[AFTER] += s.after
    row[SAVED] += saved
    row[TOKENS] += tokens
    row[USD] += tokens * price if price is not None else 0
    return int(s.kind == "pruned" and s.note == "pruned now")


def _copy(sums: Sums) -> Sums:
    return {k: list(v) for k, v in sums.items()}


def _would(s: Segment) -> Segment:
    return evolve(s, action="would-clamp") if s.action == "clamped" else s


def _same_prefix(new: tuple[Any, ...], old: tuple[Any, ...]) -> int:
    """How many of the first items of `new` are the very objects of `old` (a C scan)."""
    limit = min(len(new), len(old))
    return next(compress(count(), islice(map(is_not, new, old), limit)), limit)


def segment_entry(s: Segment, saved_tokens: int, price: float | None) -> dict[str, Any]:
    """One segment's entry in the report (`/context/budget/requests/{id}`)."""
    return {
        "kind": s.kind,
        "label": s.label,
        "before": s.before,
        "after": s.after,
        "saved": s.saved,
        "savedTokens": saved_tokens,
        "savedUsd": None if price is None else saved_tokens * price,
        "action": s.action,
        "cap": s.cap,
        "messageIndex": s.message_index,
        "tool": s.tool,
        "callId": s.call_id,
        "url": s.url,
        "note": s.note,
        "strategy": s.strategy,
    }


def _fragment(s: Segment, saved_tokens: int, price: float | None) -> bytes:
    """`segment_entry` as JSON, its client strings `storable` (a label, a URL, a note)."""
    entry = segment_entry(s, saved_tokens, price)
    try:
        data = orjson.dumps(entry)
    except TypeError:
        data = b"\\u0000"  # a lone surrogate: the long way
    if b"\\u0000" in data:
        from ctxbudget.proxy.report.record import dumps_entry, storable

        data = dumps_entry(storable(entry)).encode()
    return data
