"""Every cache the proxy keeps between requests, in one place: what it is found by, its
bound, and why a hit tells one owner nothing of another (issue 35 item 6, issue 34).

A cache found by a value (a text, bytes, their digest) is keyed by owner too: otherwise key B
could time whether key A sent a text (one try: 7 ms against 45 ms for a 100 KB text). A
cache found by an object's identity needs no owner: the objects a request holds are its
owner's (parsed per owner: `resent`, `history`, `Tails`; made by per-owner caches), so no
other owner's request can hold the object an entry keeps. A few caches are by values no
owner sends as content (a host name, a model's price, a list's length): each says why.

`caps` keeps no cache of its own: its caches are the attributes of a `caps.Memo`, which the
proxy holds one of per app (`proxy/state.py:memo`) and one in the offload worker.

`tests/proxy/cache/test_registry.py` finds every cache constructor in `caps/`, `memory/` and
`proxy/` and fails for one not listed here; `docs/architecture.md`'s table is `table()`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ctxbudget.caps._kept import ByIdentity, ByValue, Generations, OfObjects

if TYPE_CHECKING:
    from ctxbudget.proxy.config.schema import LimitsConfig
    from ctxbudget.proxy.config.settings import Settings


@dataclass(frozen=True, kw_only=True)
class Cache:
    """One cache kept between requests."""

    where: str
    """`path:name` of the cache (a module-level name, an attribute, a cached function)."""
    key: str
    """What finds an entry; "owner" in it, or the reason none is needed in `invariant`."""
    bound: str
    """At most what it keeps (bytes or entries)."""
    invariant: str
    """Why a hit is right, and why it tells one owner nothing of another."""


_ID = "identity: only the owner whose request made the object holds it"

CACHES: tuple[Cache, ...] = (
    Cache(
        where="caps/memo.py:system_texts",
        key="owner (`Caps.owner`), system text, cap",
        bound="16 MB",
        invariant="the bootstrap files' clamp: a pure function of the key",
    ),
    Cache(
        where="caps/memo.py:bodies",
        key="body, cap, file name, owner",
        bound="8 MB",
        invariant="one file's head + tail cut: a pure function of the key",
    ),
    Cache(
        where="caps/memo.py:tool_texts",
        key="text, tool name, call id, URL, `Caps` (its owner), tool names",
        bound="16 MB",
        invariant="a tool result's clamp: a pure function of the key",
    ),
    Cache(
        where="caps/memo.py:prunable",
        key="owner, result text, tool, call id, pruning policy",
        bound="8 MB",
        invariant=(
            "a prunable result's segment, with the digest its decisions are bound to (found"
            " again when they are applied): a pure function of the key"
        ),
    ),
    Cache(
        where="caps/memo.py:calls",
        key="the assistant message object",
        bound="8 MB",
        invariant=f"its tool calls' names and arguments; {_ID}",
    ),
    Cache(
        where="proxy/state.py:memo",
        key="none (one per app)",
        bound="one `caps.Memo` (the five `caps/memo.py` caches above: 56 MB)",
        invariant="what the clamps remember between this app's requests, cleared when it "
        "closes; `caps` itself keeps nothing (two apps share nothing)",
    ),
    Cache(
        where="proxy/pipeline/worker.py:memo",
        key="none (one per worker process)",
        bound="one `caps.Memo` (56 MB)",
        invariant="the offload worker's own memo (an app's never crosses the pipe), cleared "
        "with the rest past `WORKER_RSS`",
    ),
    Cache(
        where="proxy/cache/resent.py:_kept",
        key="owner, digest of an item's bytes",
        bound="32 MB",
        invariant="an item's parsed objects, never changed in place (`CTXBUDGET_CHECK_RESENT`)",
    ),
    Cache(
        where="proxy/state.py:conversations",
        key="owner, then the bytes of the conversation's last request (compared byte for byte)",
        bound="48 MB",
        invariant=(
            "a conversation's last request (its body, weighed with 400 bytes an item; 4 an"
            " owner; past the bound the owner holding the most gives way): its items' offsets"
            " and objects, and what each stage decided for them (the clamp's `ClampState`, the"
            " client blocks' serials and digests, the checks passed, the report's tally of"
            " its segments: 512 bytes a segment); used only for a body"
            " with the same bytes up to those items, of the same owner; cleared when the app"
            " closes"
        ),
    ),
    Cache(
        where="proxy/pipeline/jobs.py:conversations",
        key="none (one per worker process)",
        bound="one `Conversations` (48 MB)",
        invariant="the offload worker's own (an app's never crosses the pipe), cleared with "
        "the rest past `WORKER_RSS`",
    ),
    Cache(
        where="proxy/wire/scan.py:_by_end",
        key="owner, a body's last 32 bytes",
        bound="32 tails",
        invariant="the tail an agent resends, compared byte for byte before use",
    ),
    Cache(
        where="proxy/wire/scan.py:_VALID",
        key="owner, seeded digest of a raw value",
        bound="256 entries",
        invariant="a large value was checked as UTF-8 (the seed is unknown to clients)",
    ),
    Cache(
        where="proxy/wire/view.py:_VIEWS",
        key="the items' objects, format extras",
        bound="8 MB",
        invariant=f"the chat-shaped view of them; {_ID}",
    ),
    Cache(
        where="proxy/wire/view.py:_COPIES",
        key="the items' objects, written texts",
        bound="8 MB",
        invariant=f"the write-back copies; {_ID}",
    ),
    Cache(
        where="proxy/wire/view.py:_LABELS",
        key="a list's name (`messages`, `input`)",
        bound="4,096 labels a name",
        invariant="`name[i]` strings: a function of a length, no owner's content",
    ),
    Cache(
        where="proxy/wire/responses.py:_calls",
        key="owner, call id",
        bound="8 MB (and 10,000 entries), each call weighed by its ids, name and arguments",
        invariant="a relayed call's name, for a continuation",
    ),
    Cache(
        where="proxy/wire/responses.py:_owners",
        key="response id (random, 50+ chars)",
        bound="50,000 entries",
        invariant="whom a response went to; it refuses other owners, it is not found by them",
    ),
    Cache(
        where="proxy/cache/prefix.py:_SHARED_KNOWN",
        key="owner, seeded digest of a block",
        bound="1,024 entries",
        invariant="the block's unseeded digest (BLAKE2b)",
    ),
    Cache(
        where="proxy/cache/prefix.py:_SERIALS",
        key="owner, seeded digest of the bytes sent",
        bound="16 MB",
        invariant="the block's serial bytes and digest: the same bytes parse alike",
    ),
    Cache(
        where="proxy/cache/sessions.py:_STABLE_KNOWN",
        key="owner, model, the first blocks' seeded digests",
        bound="1,024 entries",
        invariant="the stable-prefix hash that names a session",
    ),
    Cache(
        where="proxy/cache/blocks.py:_BYTES_KEPT",
        key="the bytes object",
        bound="16 MB",
        invariant=f"its digest; {_ID}",
    ),
    Cache(
        where="proxy/cache/prefix.py:_CLIENT_KEPT",
        key="the client's item object, owner",
        bound="16 MB",
        invariant=f"its serial bytes and digest; {_ID}",
    ),
    Cache(
        where="proxy/cache/blocks.py:_SERIAL_KEPT",
        key="the clamped object",
        bound="8 MB",
        invariant=f"its serial bytes; {_ID}",
    ),
    Cache(
        where="proxy/cache/tools.py:_inline",
        key="the `tools` bytes, owner",
        bound="8 MB",
        invariant="the MCP tools sent inline: a pure function of the bytes",
    ),
    Cache(
        where="proxy/tokens.py:_cache",
        key="owner, encoding, text's hash and length (bytes: XXH3-64)",
        bound="4,096 entries",
        invariant="a text's token count (a 64-bit collision misreports one count, never a clamp)",
    ),
    Cache(
        where="proxy/tokens.py:_objects",
        key="the block or segment object, encoding, owner",
        bound="16 MB",
        invariant=f"its token count; {_ID}",
    ),
    Cache(
        where="proxy/pipeline/jobs.py:_tokens",
        key="none (one per worker process)",
        bound="one `TokenCounter`",
        invariant="the offload worker's counter: its counts are per owner as above",
    ),
    Cache(
        where="proxy/upstream/rewrite.py:_cache",
        key="owner, model, the user's query",
        bound="512 entries",
        invariant="deep recall's search words (its note says `cached`: to their owner only)",
    ),
    Cache(
        where="proxy/cache/mirrors.py:_kept",
        key="owner, session",
        bound="64 MB (an estimate of the entries both copies hold, of the newest request's "
        "layout by column and of its bytes, and of its moved blocks' counts; the owner holding "
        "the most gives way)",
        invariant="a session's cache mirror (sent and direct) and its running bill: fed only "
        "by that owner's requests of that session; with the newest request's blocks, whose "
        "groups a block of the next is given when it is the same object (`resent`) or bytes, "
        "and whose columns the next request's shared leading groups take (`layout.lay_out`); "
        "and the token counts of the blocks its newest priced request moved "
        "(`priced.MovedTokens`), carried to a block of the next at the same place that is the "
        "same object or bytes, in the same encoding",
    ),
    Cache(
        where="proxy/report/arms.py:conversations",
        key="owner (one LRU per owner), conversation",
        bound="4,096 conversations an owner, of at most 1,024 owners",
        invariant="the conversation's arm as the database keeps it (it never changes once "
        "drawn); an owner finds only its own conversations",
    ),
    Cache(
        where="proxy/report/ledger.py:_held",
        key="owner, conversation",
        bound="1,024 conversations an owner, 32 M chars of decision texts in all (past it the "
        "owner holding the most gives way)",
        invariant="the decisions this process read or took: applied while the database is down",
    ),
    Cache(
        where="proxy/pipeline/summaries.py:_owners",
        key="owner",
        bound="1,024 owners",
        invariant="an owner's summaries in this worker: running, tried, its cooldown",
    ),
    Cache(
        where="proxy/pipeline/summaries.py:tried",
        key="owner (one per owner), a digest of the conversation and call id",
        bound="10,000 results an owner",
        invariant="a result asked for once is never asked again, whatever came of it",
    ),
    Cache(
        where="proxy/report/prices.py:_model_map",
        key="none",
        bound="one map",
        invariant="litellm's offline price map, loaded once",
    ),
    Cache(
        where="proxy/report/prices.py:input_price",
        key="model name",
        bound="512 entries",
        invariant="a public price list's lookup (~µs): no owner's content",
    ),
    Cache(
        where="proxy/report/prices.py:prices",
        key="model name",
        bound="512 entries",
        invariant="a public price list's lookup (~µs): no owner's content",
    ),
    Cache(
        where="proxy/config/schema.py:is_loopback",
        key="host name",
        bound="256 entries",
        invariant="the door's Host check, before any owner is known: no owner's content",
    ),
    Cache(
        where="proxy/stores.py:_empty",
        key="owner",
        bound="4,096 entries",
        invariant="owners known to have no memories, and when that was read",
    ),
)


def registered() -> frozenset[str]:
    """Every cache's `where`."""
    return frozenset(c.where for c in CACHES)


def table() -> str:
    """The Markdown table of `CACHES` (`docs/architecture.md` holds it as written here)."""
    lines = ["| cache | found by | bound | why a hit is right, and tells no one else anything |"]
    lines.append("|---|---|---|---|")
    for c in CACHES:
        lines.append(f"| `{c.where}` | {c.key} | {c.bound} | {c.invariant} |")
    return "\n".join(lines) + "\n"


def clear_kept() -> None:
    """Empty every registered module-level cache of the `caps._kept` types (and `weighed`
    functions) in the modules this process imported: the offload worker past its memory bound
    lets them all go."""
    for cache in CACHES:
        path, name = cache.where.split(":")
        module = sys.modules.get("ctxbudget." + path.removesuffix(".py").replace("/", "."))
        found = getattr(module, name, None)
        found = getattr(found, "kept", found)  # a `weighed` function: its `Generations`
        if isinstance(found, Generations | ByIdentity | ByValue | OfObjects):
            found.clear()


# -- the process's memory bound ---------------------------------------------------------------

MB = 1 << 20
"""A bound's "MB" (the caches weigh with `16 << 20` and the like)."""

BASELINE = 120 * MB
"""RSS of a `serve` process once started and past its first clamped requests, its caches aside:
imports (Starlette, uvicorn, aiohttp, pydantic, tiktoken's encodings) and what start-up builds
(measured: 62 MB before the first request, `bench/rss_bound.py`; 112 MB at rest after the
soak's clamped requests, `bench/soak.py`; docs/benchmarks.md)."""
LITELLM = 165 * MB
"""What importing litellm adds (a `proxy.routes` route or `memory.rewrite` configured)."""
REQUEST_BODIES = 2
"""Copies of a request's body one request holds at most on the event loop: the bytes read, and
the spliced body sent upstream (a body over 1 MiB is parsed in the offload worker; one under it
is parsed here, its objects a few times its size, still under the two copies of a large one)."""


@dataclass(frozen=True, kw_only=True)
class Entries:
    """A cache bounded by a count of entries: what one entry holds at most."""

    count: int
    """Entries at most (of each owner, with `per_owner`)."""
    each: int
    """Bytes one entry keeps alive at most: key, value and the container's share."""
    per_owner: bool = False
    """`count` is per owner (the bound then grows with the owners the proxy keys name)."""
    capped: bool = True
    """False: the code does not cap an entry's size; `each` is what real clients send
    (`why` says whose strings they are), a bound only as long as they do."""
    why: str
    """What an entry holds and why `each` covers it."""


ENTRIES: dict[str, Entries] = {
    "proxy/wire/scan.py:_by_end": Entries(
        count=32,
        each=3 * MB,
        why="a tail of a body parsed here (under 1 MiB: `LARGE_BODY`), its objects and its "
        "last 32 bytes",
    ),
    "proxy/wire/scan.py:_VALID": Entries(
        count=256, each=300, why="an owner name, a 16-byte digest, True"
    ),
    "proxy/wire/view.py:_LABELS": Entries(
        count=2 * 4096,
        each=80,
        why="`messages[i]`, `input[i]`: two names, 4,096 short strings each",
    ),
    "proxy/wire/responses.py:_owners": Entries(
        count=50_000,
        each=300,
        why="a response id (the upstream's, ~50 chars) and an owner name",
    ),
    "proxy/cache/prefix.py:_SHARED_KNOWN": Entries(
        count=1024, each=400, why="an owner name and two 16-byte digests"
    ),
    "proxy/cache/sessions.py:_STABLE_KNOWN": Entries(
        count=1024, each=400, why="an owner, a model name, a digest and a session key"
    ),
    "proxy/tokens.py:_cache": Entries(
        count=4096, each=300, why="an owner, an encoding name, two ints and a count"
    ),
    "proxy/pipeline/jobs.py:_tokens": Entries(
        count=0, each=0, why="in the offload worker, not this process (`WORKER_RSS`)"
    ),
    "proxy/upstream/rewrite.py:_cache": Entries(
        count=512,
        each=16 * 1024,
        why="an owner, a model, the user's query (recall's excerpt: 4,000 chars at most) and "
        "its search words",
    ),
    "proxy/report/arms.py:conversations": Entries(
        count=4096,
        each=400,
        per_owner=True,
        why="a conversation id (a digest's hex) and its arm",
    ),
    "proxy/report/ledger.py:_held": Entries(
        count=1,
        each=4 * 32 * MB,
        why="32 M chars of decision texts in all (`HELD_CHARS`), up to 4 bytes a char",
    ),
    "proxy/pipeline/summaries.py:_owners": Entries(
        count=1024,
        each=2048,
        why="an owner's running summaries (4 at most) and its cooldown; its tried results "
        "are the next row",
    ),
    "proxy/pipeline/summaries.py:tried": Entries(
        count=10_000,
        each=200,
        per_owner=True,
        why="a 16-byte digest of the conversation and call id (`_tried_key`), whatever their "
        "size, and the LRU's links",
    ),
    "proxy/report/prices.py:_model_map": Entries(
        count=1,
        each=12 * MB,
        why="litellm's offline price map, parsed (4,242 models: 8.8 MB by `footprint`, 4.8 MB "
        "of RSS)",
    ),
    "proxy/report/prices.py:input_price": Entries(
        count=512, each=300, why="a model name and a price"
    ),
    "proxy/report/prices.py:prices": Entries(count=512, each=600, why="a model name, its prices"),
    "proxy/config/schema.py:is_loopback": Entries(
        count=256, each=300, why="a host name (a Host header's, under 64 KB of headers: 431)"
    ),
    "proxy/stores.py:_empty": Entries(count=4096, each=300, why="an owner name and a time"),
}
"""The caches not bounded in bytes, each with what one entry holds at most (a cache whose
`bound` starts with "N MB" needs no row)."""

_HELD_ELSEWHERE = ("one `caps.Memo`", "one `Conversations`")
"""Bounds that are other rows: an app's memo is the `caps/memo.py` caches, the worker's memo
and conversations are in the worker (`WORKER_RSS`)."""


def cache_bytes(cache: Cache, *, owners: int = 1) -> int:
    """At most what `cache` keeps alive, in bytes, with `owners` owners; `KeyError` for a
    cache bounded by a count of entries and missing from `ENTRIES`.

    >>> cache_bytes(Cache(where="a.py:x", key="owner", bound="16 MB", invariant="-")) // MB
    16
    """
    head = cache.bound.split(" ", 2)
    if len(head) >= 2 and head[1] == "MB" and head[0].isdigit():
        return int(head[0]) * MB
    if cache.bound.startswith(_HELD_ELSEWHERE):
        return 0
    entries = ENTRIES[cache.where]
    return entries.count * entries.each * (owners if entries.per_owner else 1)


@dataclass(frozen=True, kw_only=True)
class RssBound:
    """The most a `serve` process holds, in bytes, and its parts (`rss_bound`)."""

    baseline: int
    """`BASELINE`, and `LITELLM` when it is imported."""
    caches: int
    """Every registered cache at its bound."""
    requests: int
    """The bodies of the requests one client may have open at once."""
    worker: int
    """The offload worker's process: its own bound, plus the body of the job past it."""

    @property
    def proxy(self) -> int:
        """The `serve` process alone."""
        return self.baseline + self.caches + self.requests

    @property
    def total(self) -> int:
        """The process and its offload worker."""
        return self.proxy + self.worker

    def __str__(self) -> str:
        return (
            f"{self.total // MB:,} MB at most: this process {self.proxy // MB:,} MB (at start "
            f"{self.baseline // MB} MB, caches {self.caches // MB} MB, open requests "
            f"{self.requests // MB:,} MB), its offload worker {self.worker // MB:,} MB"
        )


def rss_bound(
    settings: Settings,
    limits: LimitsConfig,
    *,
    worker_rss: int,
    connections: int | None = None,
) -> RssBound:
    """The one number memory is bounded by: the process after start-up (+ litellm when a
    route or deep recall's rewrite imports it), every cache of `CACHES` at its bound, a
    request's bodies (`REQUEST_BODIES` × `proxy.maxBodyBytes`) for each connection one client
    may hold (`proxy.limits.maxConnectionsPerClient`; `connections` when uncapped, or to ask
    about another count), and the offload worker (`worker_rss`, the bound past which it empties
    its caches, plus the body of the job that took it there).

    Owners are the names the proxy keys give (one without keys): per-owner caches grow with
    them."""
    owners = max(1, len(set(settings.proxy_keys.values())))
    litellm = bool(settings.routes) or settings.rewrite is not None
    if connections is None:
        connections = limits.max_connections_per_client or 1
    return RssBound(
        baseline=BASELINE + (LITELLM if litellm else 0),
        caches=sum(cache_bytes(c, owners=owners) for c in CACHES),
        requests=connections * REQUEST_BODIES * settings.max_body_bytes,
        worker=worker_rss + REQUEST_BODIES * settings.max_body_bytes,
    )
