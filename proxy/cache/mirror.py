"""A mirror of the provider's prompt cache, per session: what it holds, what a request will
read and write, and what the client's own stream would have been billed.

DESIGN.md ("The provider's cache, mirrored"). A provider bills a prompt's tokens in classes —
uncached input, cache reads, cache writes (Anthropic: at the lifetime of the breakpoint that
ends them) — and which class a token falls in depends on what the provider holds from the
requests before. The mirror plays each provider's documented rules over a request's blocks:

- **Anthropic** (`AnthropicMirror`): an entry is stored only at a `cache_control` breakpoint
  (at most 4 a request), for the prefix up to it, when that prefix is at least the model's
  minimum (`anthropic_minimum`); a request reads the longest stored prefix that ends at one of
  the 20 block boundaries at or before one of its breakpoints; each read refreshes the entry
  for its lifetime (5 minutes, or an hour for `ttl: "1h"`); the tokens after the read up to
  each later breakpoint are written at that breakpoint's lifetime; the rest is input.
- **OpenAI** (`OpenAIMirror`): every prefix of 1,024 + 128·k tokens (never the whole prompt)
  is kept per `prompt_cache_key`, 5 minutes without use and an hour at most, or 24 hours with
  `prompt_cache_retention: "24h"`; a request reads the longest one it shares.

A block is a `MirrorBlock`: the digest of the prompt up to and including it (two prompts share
a prefix exactly when they share that digest), its tokens, and its breakpoint's lifetime. The
mirror never sees bytes: the caller says what a block is (`proxy/cache/mirror_blocks.py` for
the proxy's requests; the tests give the stand-in's own counts). It is written apart from the
billing stand-in of the tests (`tests/prompt_cache.py`), and checked against it: a mirror
checked against itself proves nothing.

>>> m = AnthropicMirror()
>>> blocks = [MirrorBlock(b"s", 2000, "5m"), MirrorBlock(b"s1", 500, None)]
>>> m.bill(blocks, now=0.0, model="claude-sonnet-4-5")   # cold: the system prompt written
Predicted(input=500, read=0, write_5m=2000, write_1h=0)
>>> m.bill(blocks, now=60.0, model="claude-sonnet-4-5")  # warm: read
Predicted(input=500, read=2000, write_5m=0, write_1h=0)
>>> m.bill(blocks, now=400.0, model="claude-sonnet-4-5")  # 340 s idle: expired, written again
Predicted(input=500, read=0, write_5m=2000, write_1h=0)
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate, compress, count, islice
from operator import add
from typing import Any, Literal, NamedTuple

Lifetime = Literal["5m", "1h"]
TokenClass = Literal["read", "5m", "1h", "input"]
"""How the provider bills a stretch of a prompt: read, written at a lifetime, or input."""
LIFETIMES: dict[str, float] = {"5m": 300.0, "1h": 3600.0}
"""Seconds an Anthropic entry lives after its last write or read."""
LOOKBACK = 20
"""Block boundaries Anthropic checks for a hit at each breakpoint, the breakpoint's own one."""
MAX_BREAKPOINTS = 4
OPENAI_FIRST = 1024
"""OpenAI caches nothing shorter; then every 128 tokens more."""
OPENAI_STEP = 128
SWEEP_SECONDS = 60.0
"""How often (the requests' clock) a mirror drops its expired entries or prefixes."""
OPENAI_KEEP: dict[str, tuple[float, float]] = {
    "in_memory": (300.0, 3600.0),
    "24h": (86_400.0, 86_400.0),
}
"""Retention → (seconds without use, seconds at most) a prefix is kept. OpenAI says "5 to 10
minutes of inactivity, always within an hour": the short end, as a hit the mirror did not
expect costs less than a miss it did."""


def anthropic_minimum(model: str) -> int:
    """The shortest prefix Anthropic caches for `model`, in tokens (its prompt caching guide):
    4,096 for Opus 4.5 and later and Haiku 4.5, 2,048 for Sonnet 4.6 and the older Haikus,
    1,024 for the rest.

    >>> anthropic_minimum("claude-opus-4-6"), anthropic_minimum("claude-3-5-haiku")
    (4096, 2048)
    >>> anthropic_minimum("claude-sonnet-4-5")
    1024
    """
    name = model.rsplit("/", 1)[-1]
    if any(p in name for p in ("opus-4-5", "opus-4-6", "opus-5", "haiku-4-5")):
        return 4096
    if "sonnet-4-6" in name or "haiku" in name:
        return 2048
    return 1024


class MirrorBlock(NamedTuple):
    """One block of a prompt, in the provider's order."""

    key: bytes
    """Digest of the prompt up to and including this block (its breakpoint marker not part of
    it: moving a marker does not change the prefix)."""
    tokens: int
    ttl: Lifetime | None = None
    """The lifetime of the block's `cache_control` breakpoint; None: not a breakpoint."""


@dataclass(frozen=True)
class Predicted:
    """A prompt's tokens by how the provider bills them."""

    input: int
    read: int = 0
    write_5m: int = 0
    write_1h: int = 0
    spans: tuple[tuple[int, TokenClass], ...] = field(default=(), compare=False, repr=False)
    """Where each class lies in the prompt, in order: (where its stretch ends, in the blocks'
    tokens; the class). Read first, then the writes, then input: the report prices the
    classes again from each block's own token count (`proxy/report/record.py`)."""

    @property
    def total(self) -> int:
        return self.input + self.read + self.write_5m + self.write_1h


class AnthropicMirror:
    """What Anthropic holds for one session: entries at breakpoints, by prefix digest.

    A request's bill looks at the entries only where a read can be: the 20 block boundaries
    at or before each of its (at most 4) breakpoints, each a dict hit on the prefix digest.
    An entry past its time is as good as gone where it is looked at (`_held`); the expired
    ones are dropped once a minute of the requests' clock (`_sweep`), not on every request:
    a long session holds a few entries a turn for their lifetime."""

    def __init__(self) -> None:
        self._entries: dict[bytes, tuple[float, float]] = {}
        """Prefix digest → (when it expires, seconds each use keeps it)."""
        self._sweep_at = float("-inf")
        self.visited = 0
        """Entries looked at, all requests together (the work a bill does)."""

    def __len__(self) -> int:
        return len(self._entries)

    def bill(
        self, blocks: Sequence[MirrorBlock], *, now: float, model: str, keep: bool = True
    ) -> Predicted:
        """What a request of `blocks` at `now` is billed; with `keep`, the mirror then holds
        what it wrote and refreshed (else it is left as it was: a what-if)."""
        return self.bill_parts(
            [b.key for b in blocks],
            [b.tokens for b in blocks],
            [b.ttl for b in blocks],
            now=now,
            model=model,
            keep=keep,
        )

    def bill_parts(
        self,
        keys: Sequence[bytes],
        tokens: Sequence[int],
        ttls: Sequence[Lifetime | None],
        *,
        now: float,
        model: str,
        keep: bool = True,
        ends: Sequence[int] | None = None,
        marks: Sequence[int] | None = None,
    ) -> Predicted:
        """`bill` of the blocks given by column: their digests, tokens and lifetimes (and,
        when the caller has them, where each ends: `ends[k]` the first `k`; where the
        breakpoints are)."""
        entries = self._entries
        if keep and now >= self._sweep_at:
            self._sweep(now)
        if ends is None:
            ends = list(accumulate(tokens, initial=0))  # one pass in C, not a line a block
        total = ends[-1]
        marks = list(marks[:MAX_BREAKPOINTS] if marks is not None
                     else islice(compress(count(), ttls), MAX_BREAKPOINTS))  # fmt: skip
        hit = -1
        looked = 0
        for i in marks:
            for j in range(i, max(-1, i - LOOKBACK), -1):
                looked += 1
                if self._held(keys[j], now) is not None:
                    # nearer the breakpoint is longer: the first found is this one's best
                    if hit < 0 or ends[j + 1] > ends[hit + 1]:
                        hit = j
                    break
        self.visited += looked
        read = ends[hit + 1] if hit >= 0 else 0
        written = {"5m": 0, "1h": 0}
        done = read
        minimum = anthropic_minimum(model)
        kept: list[tuple[bytes, float]] = []
        spans: list[tuple[int, TokenClass]] = [(read, "read")]
        for i in marks:
            ttl = ttls[i] or "5m"
            end = ends[i + 1]
            if end < minimum:
                continue  # too short to cache: input, or part of a later breakpoint's write
            if end > done:
                written[ttl] += end - done
                done = end
                spans.append((done, ttl))
            kept.append((keys[i], LIFETIMES[ttl]))
        spans.append((total, "input"))
        if keep:
            if hit >= 0:
                _, life = entries[keys[hit]]
                entries[keys[hit]] = (now + life, life)
            for key, life in kept:
                old = self._held(key, now)
                life = max(life, old[1]) if old is not None else life
                entries[key] = (now + life, life)
        return Predicted(
            input=total - read - written["5m"] - written["1h"],
            read=read,
            write_5m=written["5m"],
            write_1h=written["1h"],
            spans=tuple(spans),
        )

    def _held(self, key: bytes, now: float) -> tuple[float, float] | None:
        """The entry of `key` if the provider still holds it at `now`."""
        found = self._entries.get(key)
        return found if found is not None and found[0] > now else None

    def _sweep(self, now: float) -> None:
        entries = self._entries
        for key in [k for k, (expires, _) in entries.items() if expires <= now]:
            del entries[key]
        self._sweep_at = now + SWEEP_SECONDS

    def forget_before(self, keys: Sequence[bytes]) -> None:
        """Drop every entry but those of `keys`: the provider read less than the mirror
        expected, so what it held from before is gone (what it says it read is what it holds)."""
        wanted = set(keys)
        for key in [k for k in self._entries if k not in wanted]:
            del self._entries[key]


Kept = tuple[float, float, float, float]
"""An OpenAI prefix's (last used, first written, seconds without use, seconds at most)."""


class _Chain:
    """The prefixes of an OpenAI mirror's newest request, in order: the i-th is the one of
    `OPENAI_FIRST + OPENAI_STEP * i` tokens. All were used by that request (`used`); each
    keeps when it was first written and how long it lives. The next request of a
    conversation shares most of them: it reads and refreshes them here at once (a dict of
    ~2,000 prefixes at turn 300 refreshed one by one took more than the rest of the bill)."""

    __slots__ = (
        "keys", "tokens", "ends", "steps", "written", "quiet", "most", "used", "floor", "ceiling"
    )  # fmt: skip

    def __init__(self) -> None:
        self.keys: Sequence[bytes] = []
        """The request's blocks' digests, their tokens and where each ends (`ends[k]`: the
        first `k`)."""
        self.tokens: Sequence[int] = []
        self.ends: Sequence[int] = [0]
        self.steps: list[bytes] = []
        """The digest of the block each prefix ends in."""
        self.written: list[float] = []
        self.quiet: list[float] = []
        self.most: list[float] = []
        self.used = float("-inf")
        self.floor = (0.0, 0.0, float("-inf"))
        """At most the least (seconds without use, seconds at most, first write + seconds at
        most) of the prefixes: while a request is within them none needs a change of its own."""
        self.ceiling = 0.0
        """At least the most seconds without use of any: past it since `used`, none is held."""

    def kept(self, i: int) -> Kept:
        return (self.used, self.written[i], self.quiet[i], self.most[i])

    def refresh(self, upto: int, now: float, idle: float, most: float) -> int:
        """The first `upto` prefixes used again at `now` (each as `OpenAIMirror.bill` keeps one:
        still held, its lifetimes the longer; else written anew); `used` is the caller's to
        set. Returns how many it looked at one by one: none while all are held and live at
        least as long as asked (a conversation going on), all after a quiet gap, an hour's
        end or a longer retention."""
        least_quiet, least_most, first_end = self.floor
        if not (now < self.used + least_quiet and now < first_end):
            written, quiet, lives = self.written, self.quiet, self.most
            for i in range(upto):
                if not _alive(self.kept(i), now):
                    written[i], quiet[i], lives[i] = now, idle, most
        elif idle <= least_quiet and most <= least_most:
            return 0
        for i in range(upto):
            self.quiet[i] = max(self.quiet[i], idle)
            self.most[i] = max(self.most[i], most)
        self.ceiling = max(self.quiet[:upto], default=idle)
        self.floor = (
            min(self.quiet[:upto], default=idle),
            min(self.most[:upto], default=most),
            min(map(add, self.written[:upto], self.most[:upto]), default=now + most),
        )
        return upto

    def push(self, key: bytes, kept: Kept) -> None:
        _, written, quiet, most = kept
        self.steps.append(key)
        self.written.append(written)
        self.quiet.append(quiet)
        self.most.append(most)
        least_quiet, least_most, first_end = self.floor
        self.ceiling = max(self.ceiling, quiet)
        if len(self.steps) == 1:
            self.floor = (quiet, most, written + most)
        else:
            self.floor = (min(least_quiet, quiet), min(least_most, most),
                          min(first_end, written + most))  # fmt: skip

    def cut(self, upto: int) -> list[tuple[tuple[bytes, int], Kept]]:
        """Drop the prefixes from the `upto`-th on; returns them as they were."""
        out = [((self.steps[i], _position(i)), self.kept(i)) for i in range(upto, len(self.steps))]
        for column in (self.steps, self.written, self.quiet, self.most):
            del column[upto:]
        return out


def _position(i: int) -> int:
    return OPENAI_FIRST + OPENAI_STEP * i


def shared_start(a: Sequence[Any], b: Sequence[Any], *, chained: bool = False) -> int:
    """How many leading items `a` and `b` share: list comparisons (in C, an item the same
    object compared at once), the whole of the shorter first (a conversation goes on), else
    halving. `chained`: the items are prefix digests (one equal says all before it are), so
    the halving compares one item a step, and the answer is checked once."""
    top = min(len(a), len(b))
    if chained:
        low, high = 0, top
        while low < high:
            mid = (low + high + 1) // 2
            if a[mid - 1] == b[mid - 1]:
                low = mid
            else:
                high = mid - 1
        if a[:low] == b[:low] and (low == top or a[low] != b[low]):
            return low

    def same(n: int) -> bool:
        return a[:n] == b[:n]

    if same(top):
        return top
    low, high = 0, top - 1  # same(low) holds; same(high + 1) does not
    while low < high:
        mid = (low + high + 1) // 2
        if same(mid):
            low = mid
        else:
            high = mid - 1
    return low


class OpenAIMirror:
    """What OpenAI holds for one session's `prompt_cache_key`: prefixes of 1,024 + 128·k
    tokens, each by the digest of the block it ends in and its length.

    The newest request's prefixes are its chain (`_Chain`); the others (a branch left, a
    prompt changed in the middle) are kept one by one. A request that goes on from the newest
    shares its leading blocks: their prefixes are read and refreshed on the chain at once, and
    only those in the blocks it adds are looked up (`visited`) and made. The longest held one
    is found from the end, and a warm request finds it at the first look."""

    def __init__(self) -> None:
        self._prefixes: dict[tuple[bytes, int], Kept] = {}
        """(digest of the prompt through the block the prefix ends in, tokens) → (last used,
        first written, seconds without use, seconds at most), the chain's prefixes not among
        them."""
        self._chain = _Chain()
        self._on_chain: dict[tuple[bytes, int], int] = {}
        """The chain's prefixes, each to its place on it."""
        self._sweep_at = float("-inf")
        """When expired prefixes are next dropped (`_sweep`)."""
        self.visited = 0
        """Prefixes looked at or made, all requests together (the work a bill does)."""

    def __len__(self) -> int:
        return len(self._prefixes) + len(self._on_chain)

    def bill(
        self,
        blocks: Sequence[MirrorBlock],
        *,
        now: float,
        retention: str | None = None,
        keep: bool = True,
    ) -> Predicted:
        """What a request of `blocks` at `now` is billed (no writes: OpenAI bills none)."""
        return self.bill_parts(
            [b.key for b in blocks],
            [b.tokens for b in blocks],
            now=now,
            retention=retention,
            keep=keep,
        )

    def bill_parts(
        self,
        keys: Sequence[bytes],
        tokens: Sequence[int],
        *,
        now: float,
        retention: str | None = None,
        keep: bool = True,
        ends: Sequence[int] | None = None,
    ) -> Predicted:
        """`bill` of the blocks given by column: their digests and tokens (and, when the
        caller has them, where each ends: `ends[k]` the first `k`)."""
        prefixes = self._prefixes
        chain = self._chain
        if keep and now >= self._sweep_at:
            self._sweep(now)
        idle, most = OPENAI_KEEP.get(retention or "in_memory", OPENAI_KEEP["in_memory"])
        # the blocks this request shares with the chain's (the same digest, the same tokens)
        shared = shared_start(keys, chain.keys, chained=True)
        shared = shared_start(tokens[:shared], chain.tokens[:shared])
        before = chain.ends[shared]
        if ends is None:
            made = list(chain.ends[: shared + 1])
            made += accumulate(tokens[shared:], initial=before)
            del made[shared + 1]  # the `initial`, there already
            ends = made
        total = ends[-1]
        # the chain's prefixes inside the shared blocks (never the whole prompt: its last token)
        last = min(before, total - 1)
        on_chain = 0
        if last >= OPENAI_FIRST:
            on_chain = min(len(chain.steps), (last - OPENAI_FIRST) // OPENAI_STEP + 1)
        # the prefixes past them: in the blocks this request adds or changed
        fresh: list[bytes] = []
        step = _position(on_chain)
        i = bisect_left(ends, step, 1)  # block `i - 1` ends at `ends[i]`
        while step < total:
            while ends[i] < step:
                i += 1
            fresh.append(keys[i - 1])
            step += OPENAI_STEP
        read = 0
        looked = 0
        for n in range(len(fresh) - 1, -1, -1):  # the longest first: the first held is the read
            looked += 1
            held = self._kept((fresh[n], _position(on_chain + n)))
            if held is not None and _alive(held, now):
                read = _position(on_chain + n)
                break
        else:
            # the shared ones, all last used together: none held after a quiet gap; else the
            # newest is held but past an hour of its first write
            if on_chain and now < chain.used + chain.ceiling:
                for n in range(on_chain - 1, -1, -1):
                    looked += 1
                    if _alive(chain.kept(n), now):
                        read = _position(n)
                        break
        if keep:
            # the chain's prefixes this request does not share: kept one by one, as they were
            left = chain.cut(on_chain)
            for place, kept in left:
                del self._on_chain[place]
                prefixes[place] = kept
            looked += len(left) + chain.refresh(on_chain, now, idle, most)
            chain.used = now
            for n, key in enumerate(fresh):
                place = (key, _position(on_chain + n))
                old = prefixes.pop(place, None)
                if old is None or not _alive(old, now):
                    chain.push(key, (now, now, idle, most))
                else:
                    chain.push(key, (now, old[1], max(old[2], idle), max(old[3], most)))
                self._on_chain[place] = on_chain + n
            looked += len(fresh)
            # held as given: the caller's columns are not changed after (`layout.lay_out`)
            chain.keys, chain.tokens, chain.ends = keys, tokens, ends
        self.visited += looked
        return Predicted(input=total - read, read=read, spans=((read, "read"), (total, "input")))

    def _kept(self, found: tuple[bytes, int]) -> Kept | None:
        """A prefix as held (on the chain or off it), live or not."""
        at = self._on_chain.get(found)
        return self._chain.kept(at) if at is not None else self._prefixes.get(found)

    def _sweep(self, now: float) -> None:
        """Drop the prefixes off the chain expired by `now`. Not on every request: an expired
        one still held is never read (`_alive`); the chain's go when a request leaves them."""
        prefixes = self._prefixes
        for k in [k for k, kept in prefixes.items() if not _alive(kept, now)]:
            del prefixes[k]
        self._sweep_at = now + SWEEP_SECONDS

    def forget_before(self, keys: Sequence[bytes]) -> None:
        """As `AnthropicMirror.forget_before`: keep only the prefixes ending in `keys`."""
        wanted = set(keys)
        chain = self._chain
        if not wanted.issuperset(chain.steps):
            # the chain loses some: all kept one by one (a miss; the next request reads them)
            for place, kept in chain.cut(0):
                self._prefixes[place] = kept
            self._on_chain.clear()
            chain.keys, chain.tokens, chain.ends = [], [], [0]
        for k in [k for k in self._prefixes if k[0] not in wanted]:
            del self._prefixes[k]


def _alive(kept: Kept, now: float) -> bool:
    """Whether an OpenAI prefix (last used, first written, seconds without use, seconds at
    most) is still held at `now`."""
    used, written, quiet, life = kept
    return now < used + quiet and now < written + life
