"""Large bodies, parsed and clamped in a process of their own: what the event loop holds of one.

A worker thread does not keep a 30 MB request from stalling the event loop: the work is a few
single C calls over the one 30 MB string (orjson parsing the messages ~60 ms, the web_fetch
clamp parsing the JSON inside the tool result ~60 ms, splitting it ~20 ms), and each holds the
GIL from start to end. So a body over `LARGE_BODY` goes to the worker process
(`proxy/pipeline/worker.py`), which runs `proxy/pipeline/jobs.py`'s `prepare` on it: parses it,
finds the user turn, clamps, counts the tokens saved, hashes the session prefix's blocks and
encodes. The event loop gets back an `OffloadedRequest`, a `WireRequest` like any other to the
pipeline: model, stream, the user turn, the system text, the segments (without their texts)
and their token counts, the blocks as `Digested` stand-ins (`proxy/cache/blocks.py`:
digests, the bytes of small blocks, the token counts of large ones), the short top-level
fields, and the clamped bytes — and never holds the parsed 30 MB nor hashes it.

What changes the body later is recorded and applied in the worker on a second trip (`finish`):
memory blocks (`place_memory`, `inject`) when the pipeline settles the request (`settle`: the
changed blocks come back digested, with the text of a new memory block), and
`stream_options.include_usage` when the body is encoded. A Responses continuation's call
names are asked of this process's `CallNames` while the worker clamps. A chat command in a
large request is answered from a small copy of the body with its large values emptied (what
the answer reads: model, stream, stream_options).

What stays in this process per large body: one copy of it into the pipe to the worker and,
when the forwarded body is large too, one copy back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from ctxbudget.caps import Caps, Clamp, Memo, Segment, ToolNames
from ctxbudget.memory.inject import Placement
from ctxbudget.memory.query import UserTurn
from ctxbudget.proxy.cache import blocks
from ctxbudget.proxy.cache.blocks import Block, counted
from ctxbudget.proxy.cache.prefix import ClientPrefix
from ctxbudget.proxy.cache.sessions import PrefixChange
from ctxbudget.proxy.cache.tools import InlineTools
from ctxbudget.proxy.config.settings import Settings
from ctxbudget.proxy.pipeline import jobs
from ctxbudget.proxy.pipeline.jobs import Change, CountJob, FinishJob, Prepared, PrepareJob
from ctxbudget.proxy.pipeline.work import Here, Work
from ctxbudget.proxy.pipeline.worker import OffloadError, RemoteTraceback, Worker, ask
from ctxbudget.proxy.report.tally import Tally, tally
from ctxbudget.proxy.tokens import TokenCounter
from ctxbudget.proxy.wire.conversations import Conversation, Conversations
from ctxbudget.proxy.wire.scan import TAILS
from ctxbudget.proxy.wire.types import WireFormat, WireRequest

LARGE_BODY = 1 << 20
"""Bodies past this many bytes are parsed, clamped, counted, hashed and spliced in the
worker process (`Offload.threshold`); smaller ones skip the hop (~1 ms there and back)."""
MANY_OBJECTS = 4096
"""Bodies with more objects and arrays than this (`{` and `[`: `proxy/wire/scan.py`
`structure`) take the worker too, whatever their size (`Offload.objects`). The event loop
spends ~13 µs on each message, block or item (parsing, the clamp's walk, hashing each block
for the session), so 12,700 tiny Responses items in 1 MB held it ~0.5 s (issue 24); 4,096
objects is ~50 ms. Lists count as objects do: 1 MB of `[[[…]]]` in a tool result (~520,000
lists, not one `{`) was parsed and walked on the event loop, 0.6-1.3 s (issue 35). A bracket
inside a string counts too: an overestimate that at worst costs a small body the hop, and
the clamps parse the JSON a tool result holds as text. OpenClaw's requests have ~1,300
(mostly `tools`)."""


# -- this process's side -------------------------------------------------------------------


class Offload(Worker):
    """The worker process, with the jobs a large body needs (`prepare`, then the
    `OffloadedRequest`'s own)."""

    def __init__(self, *, threshold: int = LARGE_BODY, objects: int = MANY_OBJECTS) -> None:
        # the blocks it digests are compared with this process's
        super().__init__(env={blocks.SEED_ENV: str(blocks.SEED)})
        self.threshold = threshold
        """Bodies of more bytes than this go to the worker (`takes`)."""
        self.objects = objects
        """Bodies with more `{` and `[` than this go too (`takes`)."""

    def takes(
        self, raw: bytes, owner: str = "", conversations: Conversations | None = None
    ) -> bool:
        """Whether `raw` is parsed in the worker: when the bytes left to read are over
        `threshold`, or the body has over `objects` JSON objects and arrays (a count of `{`
        and `[`, each of the items `owner` resent counted once: `Conversations.structure`,
        the app's). C passes over the bytes, before anything is parsed.

        The bytes left to read are the whole body, or, for a body that extends a list
        `owner` sent before (`Conversations.new_bytes`: a memcmp of the old bytes), its new
        part: the old items are taken as they were parsed, so a conversation growing past
        `threshold` a turn at a time stays here, with its state and its cache mirror, where
        the worker would parse all of it again every turn (~29 ms a request instead of ~17 at
        turn 300). The objects stay counted whole: tiny Responses items still cost the stages
        ~0.1 ms an item (their view is built whole), so 5,000 of them held the loop ~0.5 s a
        turn even with only their new part to read."""
        # bytes.count allocates nothing: counting by what `replace` leaves was faster alone
        # (25 µs for 186 KB) but took ~110 µs in the server, where each request's new 186 KB
        # buffer costs ~40 page faults; count takes ~70 µs there
        if conversations is None:
            return len(raw) > self.threshold or TAILS.structure(raw, owner) > self.objects
        taken = len(raw) > self.threshold and (
            conversations.new_bytes(raw, owner) > self.threshold
            # the same bytes up to the old items, but the rest not their list's extension (a
            # key given again, not JSON): it would be read whole, here
            or conversations.find(raw, owner) is None
        )
        taken = taken or conversations.structure(raw, owner) > self.objects
        if taken:
            conversations.drop(raw)  # parsed in the worker: not kept here
        return taken

    async def prepare(
        self,
        wire: WireFormat,
        raw: bytes,
        *,
        owner: str,
        clamp: Clamp,
        settings: Settings,
        apply: bool,
    ) -> tuple[Work, UserTurn | None]:
        """`raw` parsed and clamped in the worker: an `OffloadedRequest`, or for a chat
        command a request parsed here from the body's skeleton. `BadRequest` as
        `wire.parse`."""
        remote, lookup = wire.in_worker(owner, ask)
        job = PrepareJob(
            wire=remote,
            owner=owner,
            clamp=clamp,
            caps=settings.caps_for(owner),
            tools=settings.tool_names,
            apply=apply,
            encoding=settings.default_encoding,
        )
        found, encoded = await self.run(jobs.prepare, job, raw, lookup)
        if found.skeleton is not None:
            return Here(wire.parse(found.skeleton, owner=owner)), found.turn
        return OffloadedRequest(raw, found, encoded, self, job.wire, owner), found.turn


class OffloadedRequest:
    """A request parsed and clamped in the worker process (`Offload.prepare`): its `Work`,
    and the `WireRequest` that stands for it here (`body` is itself).

    `clamp()` returns what the worker's clamp found (it ran with this request's caps and
    budget); `blocks()` are `Digested`. `place_memory()`, `inject()` and `ask_usage()` are
    recorded and applied in the worker: by `settle()` (the pipeline's session stage awaits
    it, so `blocks()` show the memory blocks) and by `encode()`, which therefore may wait on
    the worker: call it from a thread, never the event loop.
    """

    def __init__(
        self,
        raw: bytes,
        found: Prepared,
        clamped: bytes | None,
        offload: Offload,
        wire: WireFormat,
        owner: str,
    ) -> None:
        self.raw = raw
        self.model = found.model
        self.stream = found.stream
        self.note = found.note
        self.found = found
        self._pruned: list[Segment] = []
        """What the last `prune` change pruned (known once settled)."""
        self._added: dict[int, str] = {}
        """The memory block `inject` added, by block index (known once settled)."""
        self._base = raw if clamped is None else clamped
        """What goes upstream when nothing is pending: as sent, clamped, or settled."""
        self._blocks = list(found.blocks)
        self._pending: list[Change] = []
        self._offload = offload
        self._wire = wire
        self._owner = owner
        self._ask = False
        self._encoded: bytes | None = None
        self._late: tuple[frozenset[str], Future[dict[str, int]]] | None = None

    @property
    def body(self) -> WireRequest:
        return self

    @property
    def changed(self) -> bool:
        return self._base is not self.raw or bool(self._pending) or self._ask

    def user_turn(self) -> UserTurn | None:
        return self.found.turn

    def system_text(self) -> str:
        return self.found.system_text

    def inline_tools(self) -> InlineTools | None:
        return self.found.tools_inline  # counted in the worker

    def clamp(self, clamp: Clamp, caps: Caps, tools: ToolNames, *, apply: bool) -> list[Segment]:
        if self.found.failure is not None:
            exc, text = self.found.failure
            raise exc from RemoteTraceback(text)
        return list(self.found.segments)

    def as_sent(self) -> None:
        """The worker clamped while it parsed: the body goes back to the client's bytes, and
        each block's forwarded value to the client's."""
        self._base = self.raw
        self._encoded = None
        self._blocks = [Block(b.label, b.client, b.client) for b in self._blocks]

    def tally(
        self,
        segments: Sequence[Segment],
        tokens: TokenCounter,
        encoding: str,
        *,
        owner: str,
        price: float | None,
        enabled: bool,
    ) -> Tally:
        """Its tokens counted in the worker beside the clamp; a result pruned since (its text
        is in the worker) at four chars a token. Made whole: the worker keeps the
        conversation (a large body is rare)."""
        counted = {
            _key(s): n for s, n in zip(self.found.segments, self.found.segment_tokens, strict=True)
        }

        def saved(s: Segment) -> int:
            return counted.get(_key(s), max(0, s.saved) // 4)

        key = (encoding, owner, price, enabled)
        return tally(segments, key=key, enabled=enabled, price=price, saved_tokens=saved)

    def memory_added(self, before: Sequence[Block]) -> dict[int, str]:
        return self._added

    async def upstream_body(self) -> bytes:
        return await asyncio.to_thread(self.encode)  # may wait on the worker

    async def litellm_values(self) -> dict[str, Any] | None:
        return await asyncio.to_thread(self.litellm_body)

    def get(self, key: str) -> Any:
        """A top-level field as a Python value; None for one over `SMALL_FIELD` bytes
        (what reads fields here reads short ones: session ids, `metadata`)."""
        return (self.found.fields or {}).get(key)

    def blocks(self) -> list[Block]:
        """The blocks as `Digested`; a change not yet settled does not show in them."""
        return list(self._blocks)

    def states(self) -> tuple[Conversation | None, Conversation | None]:
        return None, None  # the worker keeps its conversations: its segments come counted

    def client_prefix(self, owner: str) -> ClientPrefix:
        return ClientPrefix(self.blocks(), owner)  # digested in the worker: nothing to reuse

    def inject(self, lines: Sequence[str], placement: Placement) -> None:
        self._change(("inject", tuple(lines), placement))

    def place_memory(self, index: int, text: str) -> None:
        self._change(("place", index, text))

    def _change(self, change: Change) -> None:
        self._pending.append(change)
        self._encoded = None

    async def settle(self) -> None:
        """Apply the recorded memory blocks in the worker: `blocks()` and `memory_added`
        then show them."""
        if not self._pending:
            return
        job = self._finish(blocks=True)
        settled, encoded = await self._offload.run(jobs.finish, job, self._base)
        if encoded is None:
            raise OffloadError("the worker process sent no body back")
        self._blocks = [
            b if new is None else Block(b.label, b.client, new)
            for b, new in zip(self._blocks, settled.blocks, strict=True)
        ]
        self._added = settled.added
        self._pruned = list(settled.pruned)
        self._base = encoded
        self._pending = []
        self._encoded = None

    async def prune(self, caps: Caps, tools: ToolNames, memo: Memo | None = None) -> list[Segment]:
        """Applied in the worker at once (one more trip): the segments come back. (`memo`
        stays here: the worker remembers in its own.)"""
        self._change(("prune", caps, tools))
        await self.settle()
        pruned, self._pruned = self._pruned, []
        return pruned

    def defer_count(self, change: PrefixChange) -> PrefixChange:
        """`change`, with its moved blocks that were not counted (large, as the client sent
        them) to be counted in the worker once the body has gone upstream (`encode`): the
        report's writer waits for them (`PrefixChange.late`), the request does not."""
        labels = frozenset(
            m.label for m in change.moved for d in (m.client, m.forwarded) if not counted(d)
        )
        if not labels:
            return change
        self._late = (labels, Future())
        return replace(change, late=self._late[1])

    def _count_late(self) -> None:
        """Start the count `defer_count` set aside (once)."""
        late, self._late = self._late, None
        if late is None:
            return
        labels, future = late
        job = CountJob(
            wire=self._wire, owner=self._owner, labels=labels, encoding=self.found.encoding
        )
        self._offload.later(jobs.count, job, self.raw).add_done_callback(
            lambda done: _copy(done, future)
        )

    def ask_usage(self) -> bool:
        if self.found.asks_usage:
            self._ask = True
            self._encoded = None
        return self.found.asks_usage

    def forget_usage(self) -> None:
        self._ask = False
        self._encoded = None

    def encode(self) -> bytes:
        try:
            if not self._pending and not self._ask:
                return self._base
            if self._encoded is None:
                job = self._finish(ask_usage=self._ask)
                _, blob = self._offload.call(jobs.finish, job, self._base)
                if blob is None:
                    raise OffloadError("the worker process sent no body back")
                self._encoded = blob
            return self._encoded
        finally:
            self._count_late()  # after the body it waits behind

    def litellm_body(self) -> dict[str, Any] | None:
        try:
            answer, _ = self._offload.call(jobs.finish, self._finish(litellm=True), self._base)
        finally:
            self._count_late()
        found: dict[str, Any] | None = answer
        return found

    def _finish(self, **how: bool) -> FinishJob:
        return FinishJob(
            wire=self._wire,
            owner=self._owner,
            changes=tuple(self._pending),
            encoding=self.found.encoding,
            **how,
        )


def _copy(done: Future[Any], to: Future[Any]) -> None:
    exc = done.exception()
    if exc is not None:
        to.set_exception(exc)
    else:
        to.set_result(done.result())


def _key(segment: Segment) -> tuple[object, ...]:
    """What tells a segment from the others of its request, whatever its action now."""
    return (segment.kind, segment.label, segment.message_index, segment.before, segment.after)
