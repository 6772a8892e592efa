"""The jobs a large body takes to the worker process (`proxy/pipeline/worker.py`), and what
crosses the pipe for them: `prepare` (parse, find the user turn, clamp, count, digest the
blocks, encode), `finish` (apply the memory blocks and `stream_options` recorded since, and
encode again) and `count` (the tokens of large moved blocks, after the body went upstream).
Each runs in the worker, by reference: module-level functions of plain dataclasses.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgspec
import orjson

from ctxbudget.caps import Caps, Clamp, Segment, ToolNames, prune_request, remembering
from ctxbudget.memory.query import UserTurn
from ctxbudget.proxy.cache.blocks import Block, Digested, digested, read_by_ids, serial
from ctxbudget.proxy.cache.sessions import memory_added
from ctxbudget.proxy.cache.tools import InlineTools
from ctxbudget.proxy.pipeline.chat_command import find_command
from ctxbudget.proxy.pipeline.worker import memo, portable
from ctxbudget.proxy.tokens import TokenCounter, encoding_name
from ctxbudget.proxy.wire.conversations import Conversations
from ctxbudget.proxy.wire.types import WireFormat, WireRequest

_EMPTY = {ord("["): b"[]", ord("{"): b"{}", ord('"'): b'""'}
SMALL_FIELD = 1 << 16
"""Top-level fields up to this many bytes come back to the event loop (`get`); a chat
command's copy of a large body keeps its values up to this size."""


Change = tuple[str, Any, Any]
"""A recorded change: `("place", block index, text)`, `("inject", lines, placement)` or
`("prune", caps, tools)` (the decisions in `caps.pruned`)."""


@dataclass(frozen=True, kw_only=True)
class PrepareJob:
    wire: WireFormat
    """The format, as the worker parses with it (`WireFormat.in_worker`)."""
    owner: str
    clamp: Clamp
    caps: Caps
    tools: ToolNames
    apply: bool
    encoding: str
    """The default tiktoken encoding (`Settings.default_encoding`)."""


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """What the worker found in a large body: all the event loop keeps of it (beside the
    clamped bytes, sent back apart)."""

    model: str | None = None
    stream: bool = False
    note: str | None = None
    turn: UserTurn | None = None
    system_text: str = ""
    segments: tuple[Segment, ...] = ()
    """As the clamp returned them, without their texts (`original`, `clamped`)."""
    segment_tokens: tuple[int, ...] = ()
    failure: tuple[BaseException, str] | None = None
    """The exception the clamp raised, and its traceback there."""
    asks_usage: bool = False
    """What `ask_usage()` would answer."""
    encoding: str = ""
    """The request's tiktoken encoding (large blocks' tokens are counted in it)."""
    blocks: tuple[Block, ...] = ()
    """The cached prefix (`WireRequest.blocks()`) after the clamp, values as `Digested`."""
    fields: dict[str, Any] | None = None
    """Top-level fields of at most `SMALL_FIELD` bytes, as `get` reads them."""
    skeleton: bytes | None = None
    """For a chat command: the body with its large values emptied."""
    tools_inline: InlineTools | None = None
    """`inline_tools()`, its tokens counted here (definitions dropped)."""


@dataclass(frozen=True, kw_only=True)
class FinishJob:
    wire: WireFormat
    owner: str
    changes: tuple[Change, ...]
    ask_usage: bool = False
    litellm: bool = False
    blocks: bool = False
    """Send back the blocks the changes touched, digested (`settle`)."""
    encoding: str = ""


@dataclass(frozen=True, kw_only=True)
class CountJob:
    wire: WireFormat
    owner: str
    labels: frozenset[str]
    encoding: str


@dataclass(frozen=True, kw_only=True)
class Settled:
    """What `_finish` found when asked for blocks: each block as forwarded now (None: as it
    was before the changes), and the memory block `inject` added."""

    blocks: tuple[Digested | None, ...]
    added: dict[int, str]
    pruned: tuple[Segment, ...] = ()
    """The results a `prune` change pruned (their pruned texts kept, not the originals)."""


# -- the jobs, run in the worker ---------------------------------------------------------------


@functools.cache
def conversations() -> Conversations:
    """What the worker knows of each owner's conversations (the lists its jobs read): one per
    process, as its `memo` (an app's never crosses the pipe)."""
    return Conversations()


@functools.cache
def _tokens() -> TokenCounter:
    return TokenCounter()


def prepare(job: PrepareJob, raw: bytes) -> tuple[Prepared, bytes | None]:
    wire = job.wire
    request = wire.parse(raw, owner=job.owner, conversations=conversations())
    turn = request.user_turn()
    if wire.generates and find_command(turn) is not None:
        found = Prepared(model=request.model, stream=request.stream, turn=turn)
        return replace(found, skeleton=_skeleton(raw)), None
    failure = None
    segments: tuple[Segment, ...] = ()
    try:
        clamp = remembering(job.clamp, memo())  # the worker's memo: the parent's stays there
        segments = tuple(request.clamp(clamp, job.caps, job.tools, apply=job.apply))
    except Exception as exc:  # the pipeline decides between fail-open and closed
        failure = (portable(exc), traceback.format_exc())
    encoding = encoding_name(request.model, job.encoding)
    # joined: the pipe takes bytes (the parent forwards them as they come)
    encoded = bytes(request.encode()) if request.changed else None
    found = Prepared(
        model=request.model,
        stream=request.stream,
        note=request.note,
        turn=turn,
        system_text=request.system_text(),
        segments=tuple(replace(s, original="", clamped="") for s in segments),
        segment_tokens=tuple(_tokens().saved(s, encoding, owner=job.owner) for s in segments),
        failure=failure,
        encoding=encoding,
        # token counting has no session: no blocks to hash
        blocks=_digested_blocks(request.blocks(), encoding, job.owner) if wire.generates else (),
        fields=_small_fields(request, raw),
        asks_usage=request.ask_usage(),  # asked after encoding: only the answer is kept
        tools_inline=_counted(request.inline_tools(), encoding, job.owner),
    )
    return found, encoded


def _counted(tools: InlineTools | None, encoding: str, owner: str) -> InlineTools | None:
    if tools is None:
        return None
    counted = _tokens().count_bytes(tools.definitions, encoding, owner=owner)
    return InlineTools(tools.count, tokens=counted)


def _digested_blocks(blocks: Sequence[Block], encoding: str, owner: str) -> tuple[Block, ...]:
    """`blocks` with `Digested` values; the first after `tools` keeps its stable text. A
    large block as forwarded is counted here (the clamp made it: rare), one as the client sent
    it only if the session stage finds it moved, while the request goes on
    (`OffloadedRequest.defer_count`)."""

    def count(text: str) -> int:
        return _tokens().count(text, encoding, owner=owner)

    out = []
    stable = True
    read = read_by_ids(blocks)
    for i, b in enumerate(blocks):
        first = stable and b.label != "tools"
        stable = stable and not first
        client = digested(b.client, stable=first, shared=i in read)
        forwarded = client if b.forwarded is b.client else digested(b.forwarded, count)
        out.append(Block(b.label, client, forwarded))
    return tuple(out)


def count(job: CountJob, raw: bytes) -> tuple[dict[str, int], None]:
    """The tokens of the client's blocks `job.labels` of `raw`."""
    request = job.wire.parse(raw, owner=job.owner, conversations=conversations())
    return {
        b.label: _tokens().count(
            serial(b.client).decode(errors="replace"), job.encoding, owner=job.owner
        )
        for b in request.blocks()
        if b.label in job.labels
    }, None


def finish(job: FinishJob, body: bytes) -> tuple[Any, bytes | None]:
    # the body as the proxy changed it: what is kept of it (`resent`, `history`) is kept
    # apart from what the client sent, which it would push out (no owner has a NUL)
    request = job.wire.parse(body, owner=job.owner + "\x00changed", conversations=conversations())
    start = request.blocks() if job.blocks else []
    # the blocks before the first injection, when there was one (the very list `start` is
    # when nothing changed between: `blocks()` is one list while the body is unchanged)
    before: list[Block] | None = None
    pruned: list[Segment] = []
    for kind, first, second in job.changes:
        if kind == "place":
            request.place_memory(first, second)
        elif kind == "prune":
            found = request.clamp(remembering(prune_request, memo()), first, second, apply=True)
            pruned += (replace(s, original="") for s in found)
        else:
            if job.blocks and before is None:
                before = request.blocks()
            request.inject(first, second)
    if job.ask_usage:
        request.ask_usage()
    if job.litellm:
        return request.litellm_body(), None
    encoded = bytes(request.encode())
    if not job.blocks:
        return None, encoded

    def count(text: str) -> int:
        return _tokens().count(text, job.encoding, owner=job.owner)

    after = request.blocks()
    added = memory_added(before, after) if before is not None else {}
    if len(after) != len(start):
        after = start  # no change adds blocks; be safe if one does
    blocks = tuple(
        None if new.forwarded is old.forwarded else digested(new.forwarded, count)
        for old, new in zip(start, after, strict=True)
    )
    return Settled(blocks=blocks, added=added, pruned=tuple(pruned)), encoded


def _small_fields(request: WireRequest, raw: bytes) -> dict[str, Any]:
    """The top-level fields of at most `SMALL_FIELD` bytes, as `request.get` reads them."""
    try:
        fields = msgspec.json.decode(raw, type=dict[str, msgspec.Raw])
    except msgspec.MsgspecError:
        return {}
    return {key: request.get(key) for key, value in fields.items() if len(value) <= SMALL_FIELD}


def _skeleton(raw: bytes) -> bytes | None:
    """`raw` with each top-level value over `SMALL_FIELD` bytes emptied, or None when it
    is not a plain JSON object."""
    try:
        fields = msgspec.json.decode(raw, type=dict[str, msgspec.Raw])
    except msgspec.MsgspecError:
        return None
    parts = []
    for key, value in fields.items():
        data = bytes(value) if len(value) <= SMALL_FIELD else _EMPTY.get(memoryview(value)[0])
        if data is None:
            return None
        parts.append(orjson.dumps(key) + b":" + data)
    return b"{" + b",".join(parts) + b"}"
