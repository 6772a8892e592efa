"""The wire adapter interface: everything the pipeline needs to know about one API format.

The pipeline (`proxy/pipeline/stages.py`) is format-neutral. What differs between OpenAI chat
completions, Anthropic Messages and OpenAI Responses sits behind two small Protocols:

- `WireFormat`: one per format, stateless. Parses a body into a `WireRequest`; says where
  requests go upstream and with which credentials; shapes the proxy's own answers (errors,
  the `/context budget` command) as that format's JSON or SSE; says how usage looks in a reply.
- `WireRequest`: one parsed request. Finds the latest user turn and the system prompt,
  clamps its segments through `caps`, places recalled memories, and writes itself back by
  splicing: fields it did not change reach the upstream byte for byte.

Adding a format is one module implementing both, and its tests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ctxbudget.caps import (
    Caps,
    Clamp,
    ClampResult,
    ClampState,
    Segment,
    ToolNames,
)
from ctxbudget.caps._kept import ChangedInPlace, footprint
from ctxbudget.caps.resume import decisions
from ctxbudget.memory.inject import Placement
from ctxbudget.memory.query import UserTurn
from ctxbudget.proxy.cache.blocks import Block
from ctxbudget.proxy.cache.prefix import ClientPrefix
from ctxbudget.proxy.cache.resent import RESENT
from ctxbudget.proxy.cache.tools import InlineTools
from ctxbudget.proxy.config.settings import Settings
from ctxbudget.proxy.errors import CtxBudgetError
from ctxbudget.proxy.upstream.http import Body
from ctxbudget.proxy.wire.body import JsonBody
from ctxbudget.proxy.wire.conversations import Conversation, Conversations, same_prefix
from ctxbudget.proxy.wire.view import paired

Asker = Callable[[str], Any]
"""A question by key, answered by a value that pickles (or None)."""


@dataclass(frozen=True)
class Reply:
    """An answer the proxy makes itself (the chat command): JSON bytes, or SSE events."""

    body: bytes | AsyncIterator[bytes]
    media_type: str


class WireRequest(Protocol):
    """One parsed request of some format; changed in place by clamping and injection."""

    raw: bytes
    """The body as the client sent it."""
    note: str | None
    """What the report should say about the request as a whole (e.g. a continuation)."""

    @property
    def model(self) -> str | None: ...

    @property
    def stream(self) -> bool: ...

    @property
    def changed(self) -> bool:
        """Whether `encode()` would differ from `raw`."""
        ...

    def user_turn(self) -> UserTurn | None:
        """The latest real user text (agent-internal context skipped), or None."""
        ...

    def system_text(self) -> str:
        """The system prompt's text (for the memory budget's window share)."""
        ...

    def inline_tools(self) -> InlineTools | None:
        """The tool definitions it sends inline that tool search would defer (Claude Code's
        MCP tools), for the report's advice; None for formats or requests with none."""
        ...

    def clamp(self, clamp: Clamp, caps: Caps, tools: ToolNames, *, apply: bool) -> list[Segment]:
        """Find and clamp this request's segments; keep the clamped text only when `apply`.

        Raises whatever the clamp raises: the pipeline decides between fail-open and closed.
        """
        ...

    def inject(self, lines: Sequence[str], placement: Placement) -> None:
        """Place a memory block of `lines` (cache-safe: `user` appends to the latest turn)."""
        ...

    def get(self, key: str) -> Any:
        """A top-level field of the body as a Python value (None when absent)."""
        ...

    def blocks(self) -> list[Block]:
        """The body's cached prefix in the provider's order (tools, system, each message or
        item), each block as the client sent it and as it would be forwarded now. The same
        list to every caller while the body is unchanged: never changed in place."""
        ...

    def states(self) -> tuple[Conversation | None, Conversation | None]:
        """The state of the conversation this request extends (its last request's), and this
        request's own, where later stages carry what they worked (the report's tally);
        None for either where there is none (a short list, a large body's)."""
        ...

    def client_prefix(self, owner: str) -> ClientPrefix:
        """`ClientPrefix(blocks(), owner)`, asked before anything changed the body: the
        blocks of the items the conversation's last request had are taken as serialised and
        hashed then (`Conversation.client`)."""
        ...

    def place_memory(self, index: int, text: str) -> None:
        """Append a memory block's `text` to block `index` of `blocks()` (placing a block
        again where an earlier request of the session had it)."""
        ...

    def encode(self) -> Body:
        """The body to send upstream: `raw` itself when nothing changed; a conversation's
        list written from what its last request sent, in `Parts` (`bytes()` joins them)."""
        ...

    def ask_usage(self) -> bool:
        """Make a stream that would carry no usage ask for it; True when the body changed for
        that and the usage-only chunk must be dropped from what the client sees. (Only chat
        completions needs it: the other formats always report usage.)"""
        ...

    def forget_usage(self) -> None:
        """Undo `ask_usage` (the upstream refused `stream_options`)."""
        ...

    def litellm_body(self) -> dict[str, Any] | None:
        """The request as OpenAI chat values for a litellm route; None if the format has none."""
        ...


class InProcessRequest:
    """What the three formats' requests share (`WireRequest`'s defaults). What the pipeline
    asks of a request beside its format (settle, encode off the loop, …) is its `Work`'s
    (`proxy/pipeline/work.py`), the same whether it was parsed here or in the offload
    process.
    """

    _body: JsonBody
    _list_key = "messages"
    """The body's growing list (`Conversation.key`)."""

    def blocks(self) -> list[Block]:
        raise NotImplementedError

    def states(self) -> tuple[Conversation | None, Conversation | None]:
        found = self._body.extended(self._list_key)
        return (found[0] if found is not None else None), self._body.conversation

    def client_prefix(self, owner: str) -> ClientPrefix:
        blocks = self.blocks()
        body = self._body
        items = body.get(self._list_key)
        head = len(blocks) - len(items) if isinstance(items, list) else -1
        found = body.extended(self._list_key)
        prefix = None
        if found is not None and found[0].client is not None and head >= 0:
            (known, known_head), kept = found[0].client, found[1]
            if known_head == head and head + kept <= len(known.blocks) and not known.spent:
                prefix = ClientPrefix(blocks, owner, reuse=(known, head, head + kept))
                if RESENT.check and prefix.digests != ClientPrefix(blocks, owner).digests:
                    raise ChangedInPlace("a conversation's client blocks differ from last time")
        if prefix is None:
            prefix = ClientPrefix(blocks, owner)
        if body.conversation is not None and head >= 0:
            body.conversation.client = (prefix, head)
        self._prefix = prefix  # told which blocks `_paired` takes as made (`taken`)
        return prefix

    def _blocks_of(self, sources: tuple[Any, ...], make: Callable[[], list[Block]]) -> list[Block]:
        """`make()`, made again only when one of `sources` (what the blocks show) is another
        object since the last call: a request asks for its blocks up to five times (the
        client prefix, before recall, the session, the mirror, pruning), and nothing changes a
        list in place: each caller gets the same list (copied, a long conversation's ~600
        blocks were copied five times a request)."""
        known: tuple[tuple[Any, ...], list[Block]] | None = self.__dict__.get("_known_blocks")
        if known is not None and all(a is b for a, b in zip(known[0], sources, strict=True)):
            return known[1]
        blocks = make()
        self._known_blocks = (sources, blocks)
        return blocks

    def _paired(self, client: list[Any], forwarded: list[Any]) -> list[Block]:
        """`paired` of the body's growing list: the blocks of the items the conversation's
        last request had, showing the very objects these do, taken as made then."""
        body, key = self._body, self._list_key
        found = body.extended(key)
        as_sent = forwarded is client
        known = None
        if found is not None:
            last = found[0].blocks.get(as_sent)
            if last is not None and len(client) == len(forwarded):
                limit = min(found[1], len(last[1]))
                if as_sent and body.conversation is not None:
                    # the client's items, read as the conversation's extension (its state
                    # made, `JsonBody._items_parsed`): the first `found[1]` are the very
                    # objects its request had (`Conversation.parsed`), whose blocks these
                    # are, by construction: not compared again
                    same = limit
                    if RESENT.check and same_prefix(forwarded, last[0], limit) != limit:
                        raise ChangedInPlace("a conversation's items are not its last ones")
                else:
                    same = self._clamped_same(forwarded, last[0], found[0].clamped, limit)
                known = (last[1], same)
        blocks = paired(key, client, forwarded, body.raw_items(key), known=known)
        if body.conversation is not None:
            body.conversation.blocks[as_sent] = (forwarded, blocks)
        prefix: ClientPrefix | None = self.__dict__.get("_prefix")
        if prefix is not None:
            prefix.taken = (blocks, known[0], known[1]) if known else (blocks, None, 0)
        return blocks

    def _clamped_by(self, state: ClampState | None, messages: list[Any]) -> None:
        """`messages` is the list the clamp wrote, its first `state.kept` the very objects of
        the list the conversation's last request's clamp wrote (`Conversation.clamped`)."""
        kept = 0
        if state is not None and 0 < state.kept <= len(messages):
            # the clamp's own list (not a stand-in clamp's), or nothing is known of it
            if messages[state.kept - 1] is state.out[state.kept - 1]:
                kept = state.kept
        self._clamped = (messages, kept)
        conversation = self._body.conversation
        if conversation is not None:
            conversation.clamped = messages

    def _clamped_same(
        self, forwarded: list[Any], last: list[Any], last_clamped: Any, limit: int
    ) -> int:
        """How many of the first `limit` items of `forwarded` (as changed) are the very
        objects of `last` (the conversation's last request's, as changed): known without
        comparing when both are the lists their clamps wrote (nothing changed them after:
        no memory placed, nothing pruned), else compared (a C scan)."""
        clamped: tuple[list[Any], int] | None = self.__dict__.get("_clamped")
        if (
            clamped is None
            or forwarded is not clamped[0]
            or last_clamped is None
            or last is not last_clamped
            or self._body.conversation is None
        ):
            return same_prefix(forwarded, last, limit)
        same = min(limit, clamped[1])
        if RESENT.check and same_prefix(forwarded, last, same) != same:
            raise ChangedInPlace("a conversation's clamped items are not its last ones")
        return same

    def inline_tools(self) -> InlineTools | None:
        return None

    def encode(self) -> Body:
        raise NotImplementedError

    def litellm_body(self) -> dict[str, Any] | None:
        raise NotImplementedError

    def clamp(self, clamp: Clamp, caps: Caps, tools: ToolNames, *, apply: bool) -> list[Segment]:
        raise NotImplementedError


def resumed(
    clamp: Clamp,
    body: JsonBody,
    messages: list[Any],
    caps: Caps,
    tools: ToolNames,
    *,
    resume: tuple[ClampState, int] | None,
) -> ClampResult:
    """`clamp` of chat `messages` (`body`'s, or its view), resumed from `resume`: the clamp
    state of the conversation's last request (`Conversation.clamp`) and how many of
    `messages` are the very objects its first ones were; its decisions kept for the next."""
    state = None if resume is None else resume[0].upto(resume[1])
    start = len(state) if state is not None else 0  # before the clamp takes its lists
    if state is None:
        result = clamp({"messages": messages}, caps, tools=tools)
    else:
        result = clamp({"messages": messages}, caps, tools=tools, resume=state)
        if RESENT.check:  # what was resumed must be what a whole clamp gives
            whole = clamp({"messages": messages}, caps, tools=tools)
            if (whole.segments, whole.request, whole.changed) != (
                result.segments,
                result.request,
                result.changed,
            ):
                raise ChangedInPlace("a conversation's clamp resumed to another result")
            if (
                whole.state is not None
                and result.state is not None
                and decisions(whole.state) != decisions(result.state)
            ):
                raise ChangedInPlace("a conversation's clamp state resumed to other decisions")
    conversation = body.conversation
    if conversation is not None and result.state is not None and body.conversations is not None:
        conversation.clamp = result.state
        # what it holds beyond the items: the messages it cut, and their segments' texts
        out = result.state.out
        grew = sum(
            2 * (footprint(out[i]) or 0)
            for i in range(start, len(out))
            if out[i] is not messages[i]
        )
        if grew:
            body.conversations.grew(body.owner, conversation, grew)
    return result


class ReplyWatcher(Protocol):
    """Reads a relayed reply as it passes (a format that must remember something from it)."""

    def feed(self, chunk: bytes) -> None:
        """The next bytes of the reply (SSE or JSON), exactly as relayed."""
        ...

    def close(self) -> None:
        """The reply ended (completed or not)."""
        ...


class WireFormat(Protocol):
    """One API format: parsing, upstream target, and the shapes of the proxy's own answers."""

    name: str
    """Short name, recorded with each request (`chat`, `messages`, `responses`)."""
    provider: str
    """Who the upstream speaks for, as the report's `route` names it (`openai`, `anthropic`)."""
    generates: bool
    """The request asks for a model's answer. False for token counting: such requests are
    clamped and injected like the real one, but not recorded and never a chat command."""

    def parse(
        self, raw: bytes, *, owner: str = "default", conversations: Conversations | None = None
    ) -> WireRequest:
        """Check and parse a body; `BadRequest` that says what to fix. `owner`: whom the
        request acts for (state a format keeps across requests is kept per owner);
        `conversations`, the app's: a body that extends one of the owner's is read as its
        extension, and what is decided for it kept there."""
        ...

    def upstream_url(self, settings: Settings, path: str, query: str) -> str:
        """Where the request goes (query string kept)."""
        ...

    def upstream_headers(self, headers: Mapping[str, str], settings: Settings) -> dict[str, str]:
        """Client headers to forward, with the upstream credential set: the configured
        upstream key when there is one, else the client's own — unless the client's
        credential is a proxy key, which never goes upstream."""
        ...

    def admit(self, request: WireRequest, owner: str) -> None:
        """Refuse (`RequestError`) what `owner` may not ask of state this format keeps for
        another owner (Responses: continuing another owner's response); most formats: no-op."""
        ...

    def watch_reply(self, request: WireRequest, owner: str) -> ReplyWatcher | None:
        """Something to read the reply as it is relayed, or None (most formats)."""
        ...

    def in_worker(self, owner: str, ask: Asker) -> tuple[WireFormat, Asker | None]:
        """This format as the offload worker parses `owner`'s request with it (a copy that
        pickles), and how this process answers what that copy asks (by `ask`, the worker's
        way to ask) of the state this format keeps here (Responses: the call names its
        replies made); most formats: themselves, and nothing to answer."""
        ...

    def error_body(self, error: CtxBudgetError) -> dict[str, Any]:
        """The proxy's own error in this format's error shape."""
        ...

    def stream_error(self, error: CtxBudgetError) -> bytes:
        """An SSE event telling a client mid-stream that the upstream broke."""
        ...

    def command_reply(self, text: str, request: WireRequest, *, request_id: str) -> Reply:
        """The `/context budget` answer as this format's reply (SSE when the request streams)."""
        ...
