"""One proxied request as the report keeps it: the typed record, and its JSON entry.

The request path builds a `RequestRecord` and queues it; the writer thread turns it into the
JSON entry (`report_entry`) that `/context/budget/requests/{id}`, the recent list, the page and
the telemetry sink all read, counting the tokens the request path did not count.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import accumulate, compress
from operator import attrgetter
from typing import Any, TypeVar

import orjson

from ctxbudget.caps import Segment
from ctxbudget.proxy.cache.blocks import held
from ctxbudget.proxy.cache.mirror import Predicted, TokenClass
from ctxbudget.proxy.cache.mirrors import MISS_SHARE, MISS_TOKENS, MirrorView
from ctxbudget.proxy.cache.priced import moved_tokens
from ctxbudget.proxy.cache.sessions import Moved, PrefixChange
from ctxbudget.proxy.cache.tools import InlineTools
from ctxbudget.proxy.report.billing import Shift, cost, without
from ctxbudget.proxy.report.prices import Prices
from ctxbudget.proxy.report.tally import Tally, tally
from ctxbudget.proxy.report.usage import Usage
from ctxbudget.proxy.tokens import TokenCounter

_T = TypeVar("_T")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_CLIENT_FIELDS = ("model", "response_model", "note", "session", "clamp_error", "upstream_error")
# the holdout's conversation id is made of hex digests and the session id (`storable` by then)


@dataclass(frozen=True, kw_only=True)
class RequestRecord:
    """What the proxy did with one request; queued by the pipeline, written by the store."""

    id: str
    ts: float
    """When the request finished (epoch seconds)."""
    model: str | None
    enabled: bool
    """Whether the caps were on for this request."""
    stream: bool
    status: int
    """The status the client got (499: it went away; 502: the upstream broke mid-stream)."""
    duration_ms: float
    segments: tuple[Segment, ...]
    encoding: str
    """tiktoken encoding the saved tokens are counted in."""
    route: str = "openai"
    """`openai` or `anthropic` (the upstream), or the litellm model it was routed to."""
    wire: str = "chat"
    """The wire format the client spoke (`chat`, `messages`, `responses`)."""
    clamp_error: str | None = None
    upstream_error: str | None = None
    segment_tokens: tuple[int, ...] = ()
    """Tokens saved per segment, when the request path already counted them."""
    input_price: float | None = None
    """USD per input token of the request's model (litellm's map); None when unknown."""
    marks: dict[str, int] = field(default_factory=dict)
    """Wall-clock ns of the request's phases (start, parsed, clamped, recall_start, …, end)."""
    response_id: str | None = None
    """The upstream's id for its reply, when its usage said."""
    response_model: str | None = None
    """The model that answered, when the reply's usage event said."""
    memory: dict[str, Any] | None = None
    """What recall did (`RecallReport.to_dict()`), or None when it had nothing to do."""
    worker: int = 0
    """Process id of the worker that served it."""
    owner: str = "default"
    """Whose request it was (the proxy key's owner): each key sees only its own report."""
    note: str | None = None
    """What the wire adapter said about the request as a whole (e.g. a continuation)."""
    usage: Usage | None = None
    """The provider's usage from the reply; None when the reply had none."""
    session: str | None = None
    """The session it was counted in (`proxy/cache/sessions.py`)."""
    prefix: PrefixChange | None = None
    """What it did to the session's cached prefix: busts, and the blocks ctxbudget changed."""
    mirror: MirrorView | None = None
    """The session's cache mirror's prediction for it, both copies: settled by its usage
    (`mirrorDrift`), and the direct copy's is what it would have cost without ctxbudget."""
    prices: Prices | None = None
    """The model's prices (litellm's map); None when it is not priced."""
    memory_texts: tuple[str, ...] = ()
    """The memory blocks placed in it (new or placed again), for their token cost."""
    memory_reused: int = 0
    """Memories placed again from an earlier request of the session (recall did not run)."""
    memory_skipped: str | None = None
    """Why recall was skipped (the memory database did not answer), or None."""
    prune_skipped: str | None = None
    """Why no new prune could be taken (the database did not answer: the decisions held were
    applied), or None."""
    overhead: bool = False
    """A request ctxbudget made itself (a pruned result's summary): without ctxbudget it would
    not have been made, so what it cost is all loss (`withoutCtxbudgetUsd` 0)."""
    tools_inline: InlineTools | None = None
    """MCP tool definitions sent inline that tool search would defer (Claude Code), or None."""

    holdout: HoldoutMark | None = None
    """The request's conversation and arm, with a holdout configured (`contextBudget.holdout`);
    None otherwise."""

    billed: dict[str, Any] | None = None
    """`billing(self)`, when the request path already priced it (a JSON answer, for its
    `x-context-budget-saved-usd` header); None: the writer prices it."""

    tally: Tally | None = None
    """What `segments` add up to, each one's entry made (`proxy/report/tally.py`): carried
    from the conversation's last request by the pipeline; None: the writer makes it whole
    (`tally_of`)."""


@dataclass(frozen=True, kw_only=True)
class HoldoutMark:
    """What the holdout's comparison reads of one request (`proxy/report/arms.py`)."""

    conversation: str
    """The conversation id the arm was drawn for (`ClientPrefix.conversation`)."""
    arm: str
    """`budget` or `holdout`: the conversation's arm."""
    chosen: bool = False
    """The request chose the budget itself (`x-context-budget: on|off`): the conversation is
    out of the comparison."""
    turn: bool = False
    """The request carries a new turn of the user's own (not a tool loop's)."""
    tool_calls: int = 0
    """Tool results in the request's history: the conversation's tool calls so far."""
    reruns: int = 0
    """Tool calls in the history made again, the same tool with the same result, after the
    first one's result was clamped or pruned (would be, in the holdout arm)."""
    acted: bool = False
    """The request clamped or pruned something (would have, in the holdout arm)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "conversation": self.conversation,
            "arm": self.arm,
            "chosen": self.chosen,
            "turn": self.turn,
            "toolCalls": self.tool_calls,
            "reruns": self.reruns,
            "acted": self.acted,
        }


def storable(value: _T) -> _T:
    """`value` (a report entry or any part of one) with every string as both databases' text
    takes it: a lone surrogate (JSON's `\\ud800` parses to one; no UTF-8 encoder takes it) or
    a NUL (PostgreSQL's text refuses it) becomes U+FFFD. Client text reaches the report in the
    model, session id, labels, URLs, notes and errors; what went upstream is not changed.

    >>> storable({"model": "gpt\\ud800", "labels": ["a\\x00b", 3]})
    {'model': 'gpt\ufffd', 'labels': ['a\ufffdb', 3]}
    """
    if isinstance(value, str):
        if value.isascii() and "\x00" not in value:
            return value  # the common case, without a regex
        return _UNSTORABLE.sub("\ufffd", value)  # type: ignore[return-value]
    if isinstance(value, dict | list | tuple) and _clean(value):
        return value  # the common case: one C call, where walking an entry took ~0.4 ms
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}  # type: ignore[return-value]
    if isinstance(value, list | tuple):
        return type(value)(storable(v) for v in value)
    return value


def _clean(value: Any) -> bool:
    """Whether no string in `value` needs `storable`: orjson refuses a lone surrogate, and
    writes a NUL as `\\u0000` (a false alarm, a backslash before `u0000`, only costs the walk)."""
    try:
        data = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return False
    return b"\\u0000" not in data


def storable_record(r: RequestRecord) -> RequestRecord:
    """`r` with its client strings `storable`, for the sinks (telemetry exports them)."""
    changed: dict[str, Any] = {
        name: storable(text)
        for name in _CLIENT_FIELDS
        if isinstance(text := getattr(r, name), str) and storable(text) != text
    }
    return replace(r, **changed) if changed else r


def usd(tokens: int, price: float | None) -> float | None:
    """`tokens` of input at `price` USD per token (unrounded: sums stay exact to display)."""
    return None if price is None else tokens * price


def report_entry(r: RequestRecord, tokens: TokenCounter) -> dict[str, Any]:
    """The report's JSON entry for `r` (counting saved tokens the request path did not), its
    client strings `storable`, as `/context/budget/requests/{id}` reads it back."""
    result: dict[str, Any] = loads_entry(entry_and_text(r, tokens)[1])
    return result


def tally_of(r: RequestRecord, tokens: TokenCounter) -> Tally:
    """`r.tally`, or made whole from `r.segments` (as reported) and the tokens the request
    path counted (`segment_tokens`), the rest counted here."""
    if r.tally is not None:
        return r.tally
    counted = r.segment_tokens
    index = {id(s): i for i, s in enumerate(r.segments)}

    def saved(s: Segment) -> int:
        i = index[id(s)]
        return counted[i] if i < len(counted) else tokens.saved(s, r.encoding, owner=r.owner)

    key = (r.encoding, r.owner, r.input_price, True)
    return tally(r.segments, key=key, enabled=True, price=r.input_price, saved_tokens=saved)


def entry_and_text(
    r: RequestRecord, tokens: TokenCounter, *, chunked: bool = False
) -> tuple[dict[str, Any], str]:
    """The report's entry for `r` and its text (`dumps_entry`), serialised once: the text is
    what tells whether anything needs `storable`. The entry's `segments` is their JSON as
    the tally keeps it (`orjson.Fragment`): read it back from the text. `chunked`: only the
    segments after the tally's chunks (`Tally.tail`: the store keeps the chunks apart)."""
    made = tally_of(r, tokens)
    body = _entry(r, tokens, made, chunked)
    try:
        data = orjson.dumps(body)
    except TypeError:
        data = b"\\u0000"  # a lone surrogate, or a number orjson refuses: the long way
    if b"\\u0000" in data:  # what the stdlib can write too
        body["segments"] = orjson.loads(made.tail() if chunked else made.json())
        body = storable(body)
        return body, dumps_entry(body)
    return body, data.decode()


def _entry(r: RequestRecord, tokens: TokenCounter, made: Tally, chunked: bool) -> dict[str, Any]:
    clamped, saved_chars, saved_tokens = made.acted("clamped")
    would, would_chars, would_tokens = made.acted("would-clamp")
    body = {
        "id": r.id,
        "at": r.ts,
        "model": r.model,
        "route": r.route,
        "overhead": r.overhead,
        "wire": r.wire,
        "note": r.note,
        "enabled": r.enabled,
        "stream": r.stream,
        "status": r.status,
        "durationMs": round(r.duration_ms, 3),
        "encoding": r.encoding,
        "memories": (r.memory or {}).get("injected", r.memory_reused),
        "memoriesReused": r.memory_reused,
        "memorySkipped": r.memory_skipped,
        "pruneSkipped": r.prune_skipped,
        "clampError": r.clamp_error,
        "upstreamError": r.upstream_error,
        "segmentsSeen": len(made),
        "clamped": clamped,
        "wouldClamp": would,
        "savedChars": saved_chars,
        "savedTokens": saved_tokens,
        "wouldSaveChars": would_chars,
        "wouldSaveTokens": would_tokens,
        "inputPricePerMTok": None if r.input_price is None else round(r.input_price * 1e6, 6),
        "savedUsd": usd(saved_tokens, r.input_price),
        "wouldSaveUsd": usd(would_tokens, r.input_price),
        # each segment's entry made once, when first seen, and carried (`Tally.fragments`)
        "segments": orjson.Fragment(made.tail() if chunked else made.json()),
        "worker": r.worker,
        "owner": r.owner,
        "memory": r.memory,
        "usage": r.usage.to_dict() if r.usage is not None else None,
        "toolsInline": _tools_inline(r, tokens),
        "arm": r.holdout.arm if r.holdout is not None else None,
        "holdout": r.holdout.to_dict() if r.holdout is not None else None,
        **(r.billed if r.billed is not None else billing(r, tokens)),
    }
    return body


def _tools_inline(r: RequestRecord, tokens: TokenCounter) -> dict[str, int] | None:
    found = r.tools_inline
    if found is None:
        return None
    counted = found.tokens
    if counted is None:  # cached by digest: a session's requests resend the same tools
        counted = tokens.count_bytes(found.definitions, r.encoding, owner=r.owner)
    return {"count": found.count, "tokens": counted}


def billing(r: RequestRecord, tokens: TokenCounter) -> dict[str, Any]:
    """The request's session, cache busts and money: its cost from the provider's usage, and
    what it would have cost with nothing clamped or injected (`proxy/report/billing.py`)."""
    prefix = r.prefix
    late = prefix.late_tokens() if prefix is not None else {}

    def count(data: bytes) -> int:
        return tokens.count_bytes(data, r.encoding, owner=r.owner)

    moved = prefix.moved if prefix is not None else ()
    # each moved block's tokens as the client sent it and as forwarded: those the session's
    # previous request moved too carried over from its pricing (`SessionMirror.moved_tokens`),
    # only the blocks this request adds counted
    if r.mirror is not None:
        tokens_of = r.mirror.session.moved_tokens(moved, count, late, r.encoding)
    else:
        tokens_of = moved_tokens(moved, count, late, None, r.encoding).tokens
    # our block's index → its tokens: the mirror's classes are priced again from them
    # (`MirrorView.exact`); made in C, not a line a block of the history
    indexes = list(map(attrgetter("index"), moved))
    counted: dict[int, tuple[int, int]] = dict(
        compress(zip(indexes, tokens_of, strict=True), map((-1).__lt__, indexes))
    )

    def shifts() -> list[Shift]:
        """The moved blocks as `without` estimates from them (where the mirror cannot say)."""
        # Where the provider's read ended: at a bust of ours, the session's comparison says
        # how far each side would read; else the provider's own `cache_read` says it, for
        # both sides.
        read = None
        if prefix is not None and not _stopped_by_us(r.usage, prefix):
            read = _read_blocks(r.usage, prefix)
        out = []
        for m, (client, forwarded) in zip(moved, tokens_of, strict=True):
            forwarded_cached, client_cached = m.forwarded_cached, m.client_cached
            if read is not None and m.index >= 0:
                forwarded_cached = client_cached = m.index < read
            out.append(
                Shift(
                    client=client,
                    forwarded=forwarded,
                    client_cached=client_cached,
                    forwarded_cached=forwarded_cached,
                )
            )
        return out

    usage_without: Usage | None = None
    actual = would = None
    drift: int | None = None
    if r.usage is not None:
        if r.overhead:
            usage_without = Usage(input=0, cache_read=0, cache_write=0, output=0)
        elif r.mirror is not None:
            # the session's direct mirror, on every request it follows, pruned or not: it reads
            # what the client's own stream would have read (issue 31, item 4); the estimate
            # below laid the provider's read over the blocks by bytes, and booked a clamped
            # block read in full as uncached where it ended near the read's end (Codex 2.7-5.4%
            # above the direct bill)
            usage_without, drift = _direct(r.usage, r.mirror, counted)
        if usage_without is None:
            # not mirrored (a large body parsed elsewhere), or the provider held more than the
            # mirror knew (another worker or instance served the session before): estimated
            # from the moved blocks and where the provider's read ended
            usage_without = without(r.usage, shifts())
        if r.prices is not None:
            actual, would = cost(r.usage, r.prices), cost(usage_without, r.prices)
            if r.mirror is not None:  # the guard on the measured bill reads the totals
                r.mirror.count(actual, would)
    return {
        "session": r.session,
        "cacheBust": prefix.bust if prefix is not None else None,
        "clientCacheBust": bool(prefix is not None and prefix.client_cache_bust),
        "sharedPrefixBlocks": prefix.shared_forwarded if prefix is not None else None,
        "memoryTokens": sum(tokens.count(t, r.encoding, owner=r.owner) for t in r.memory_texts),
        "withoutUsage": usage_without.to_dict() if usage_without is not None else None,
        "costUsd": actual,
        "withoutCtxbudgetUsd": would,
        "netSavedUsd": None if actual is None or would is None else would - actual,
        "mirrorDrift": drift,
    }


def _direct(
    usage: Usage, view: MirrorView, counted: dict[int, tuple[int, int]] | None = None
) -> tuple[Usage | None, int]:
    """The usage the client's own request would have had, and the mirror's drift: the
    provider's usage moved by what the direct copy of the session's cache mirror predicts
    beyond the sent copy, class by class, in the provider's tokens (`MirrorView.settle`). A
    request ctxbudget left alone has the same prediction both ways: its usage, to the token.
    None for the usage when the provider read far more than the mirror expected."""
    total = usage.input + usage.cache_read + usage.cache_write
    ratio, drift = view.settle(usage.cache_read, total)
    if drift > max(MISS_TOKENS, MISS_SHARE * total):
        return None, drift  # the mirror did not know what the provider held: no prediction
    # each class moved by what the direct copy predicts beyond the sent one, every block at
    # its own token count (`counted`: the blocks ctxbudget changed; the rest at the density
    # the provider's total leaves them); at the session's one scale where that cannot be
    exact = view.exact(counted or {}, total)
    if exact is not None:
        sent, direct = exact
    else:
        sent = {k: ratio * v for k, v in _classes(view.sent).items()}
        direct = {k: ratio * v for k, v in _classes(view.direct).items()}

    def moved(actual: int, kind: TokenClass) -> int:
        return max(0, actual + round(direct[kind] - sent[kind]))

    short = moved(usage.cache_write_5m, "5m")
    hour = moved(usage.cache_write_1h, "1h")
    return (
        Usage(
            input=moved(usage.input, "input"),
            cache_read=moved(usage.cache_read, "read"),
            cache_write=short + hour,
            output=usage.output,
            cache_write_1h=hour,
        ),
        drift,
    )


def _classes(p: Predicted) -> dict[TokenClass, float]:
    return {"read": p.read, "5m": p.write_5m, "1h": p.write_1h, "input": p.input}


INLINE_COUNT_BYTES = 4096
"""Bytes of uncounted blocks `billing` may count where it is called (~0.1 ms of tokenizing);
past this, `billing_is_quick` says to call it from a thread."""


def billing_is_quick(r: RequestRecord, tokens: TokenCounter) -> bool:
    """Whether `billing(r)` has little to count: the blocks it prices are counted already
    (an agent's clamped blocks are, from every earlier turn) or small. Handing it to a thread
    costs ~0.1 ms of the request path's CPU; counting a large block on the loop costs more."""
    left = INLINE_COUNT_BYTES
    moved: Sequence[Moved] = r.prefix.moved if r.prefix is not None else ()
    # the blocks the session's previous request moved too are counted already (`billing`
    # carries their counts over): only the others are looked at
    if r.mirror is not None:
        moved = list(map(moved.__getitem__, r.mirror.session.uncounted(moved, r.encoding)))
    for m in moved:
        for data in (held(m.client), held(m.forwarded)):
            if data and not tokens.knows_bytes(data, r.encoding, owner=r.owner):
                left -= len(data)
                if left < 0:
                    return False
    return sum(len(t) for t in r.memory_texts) <= left  # counted or not: small


def _read_blocks(usage: Usage | None, prefix: PrefixChange | None) -> int | None:
    """How many leading blocks the provider read from its cache: its `cache_read` tokens laid
    over the blocks in proportion to their bytes (a block read whole, up to 2% either way);
    None when the request has no usage or no sizes.

    The session's own comparison says what *could* be read; this says what was: a provider
    may write a prefix again that the client resent unchanged (Anthropic's breakpoints look
    back 20 blocks at most, and Claude Code writes its whole history twice after an idle
    gap), and blocks written are priced as writes both ways."""
    if usage is None or prefix is None or not prefix.sizes:
        return None
    total = usage.input + usage.cache_read + usage.cache_write
    size = sum(prefix.sizes)
    if total <= 0 or size <= 0:
        return None
    reach = usage.cache_read / total * size * 1.02
    # the first block that ends past it, found in C (a loop over a long history's blocks
    # was a line a block a request)
    return bisect_right(list(accumulate(prefix.sizes)), reach)


def _stopped_by_us(usage: Usage | None, prefix: PrefixChange) -> bool:
    """Whether the provider's read ended where ctxbudget changed a block the client kept (a
    bust of ours): then without ctxbudget it would have read on, as far as the client's
    prefix matched. Its `cache_read` tokens, laid over the blocks by bytes, reach at least
    three quarters of the way to that block (bytes a token vary along a request: a clamped
    system prompt ~3.7, tool schemas and code fewer)."""
    if usage is None or prefix.bust is None or not prefix.sizes:
        return False
    total = usage.input + usage.cache_read + usage.cache_write
    if total <= 0:
        return False
    reach = usage.cache_read / total * sum(prefix.sizes)
    return reach >= 0.75 * sum(prefix.sizes[: prefix.shared_forwarded])


def dumps_entry(body: dict[str, Any]) -> str:
    """A report entry (`report_entry`'s: `storable`) as JSON text; the stdlib's when orjson
    refuses something in it."""
    try:
        return orjson.dumps(body).decode()
    except TypeError:
        return json.dumps(body)


def loads_entry(text: str | bytes) -> Any:
    """An entry written by `dumps_entry`. Entries written before `report_entry` made them
    `storable` may hold a lone surrogate escaped (orjson refuses it): made `storable` here,
    so such an entry cannot break the report for as long as it is kept."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return storable(json.loads(text))
