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

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

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
"""How often (the requests' clock) an OpenAI mirror drops its expired prefixes."""
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
    """What Anthropic holds for one session: entries at breakpoints, by prefix digest."""

    def __init__(self) -> None:
        self._entries: dict[bytes, tuple[float, float]] = {}
        """Prefix digest → (when it expires, seconds each use keeps it)."""

    def __len__(self) -> int:
        return len(self._entries)

    def bill(
        self, blocks: Sequence[MirrorBlock], *, now: float, model: str, keep: bool = True
    ) -> Predicted:
        """What a request of `blocks` at `now` is billed; with `keep`, the mirror then holds
        what it wrote and refreshed (else it is left as it was: a what-if)."""
        entries = self._entries
        for key in [k for k, (expires, _) in entries.items() if expires <= now]:
            del entries[key]
        ends: list[int] = []
        total = 0
        for b in blocks:
            total += b.tokens
            ends.append(total)
        marks = [i for i, b in enumerate(blocks) if b.ttl is not None][:MAX_BREAKPOINTS]
        hit = -1
        for i in marks:
            for j in range(i, max(-1, i - LOOKBACK), -1):
                if blocks[j].key in entries:
                    # nearer the breakpoint is longer: the first found is this one's best
                    if hit < 0 or ends[j] > ends[hit]:
                        hit = j
                    break
        read = ends[hit] if hit >= 0 else 0
        written = {"5m": 0, "1h": 0}
        done = read
        minimum = anthropic_minimum(model)
        kept: list[tuple[bytes, float]] = []
        spans: list[tuple[int, TokenClass]] = [(read, "read")]
        for i in marks:
            ttl = blocks[i].ttl or "5m"
            if ends[i] < minimum:
                continue  # too short to cache: input, or part of a later breakpoint's write
            if ends[i] > done:
                written[ttl] += ends[i] - done
                done = ends[i]
                spans.append((done, ttl))
            kept.append((blocks[i].key, LIFETIMES[ttl]))
        spans.append((total, "input"))
        if keep:
            if hit >= 0:
                _, life = entries[blocks[hit].key]
                entries[blocks[hit].key] = (now + life, life)
            for key, life in kept:
                old = entries.get(key)
                life = max(life, old[1]) if old is not None else life
                entries[key] = (now + life, life)
        return Predicted(
            input=total - read - written["5m"] - written["1h"],
            read=read,
            write_5m=written["5m"],
            write_1h=written["1h"],
            spans=tuple(spans),
        )

    def forget_before(self, keys: Sequence[bytes]) -> None:
        """Drop every entry but those of `keys`: the provider read less than the mirror
        expected, so what it held from before is gone (what it says it read is what it holds)."""
        wanted = set(keys)
        for key in [k for k in self._entries if k not in wanted]:
            del self._entries[key]


class OpenAIMirror:
    """What OpenAI holds for one session's `prompt_cache_key`: prefixes of 1,024 + 128·k
    tokens, each by the digest of the block it ends in and its length."""

    def __init__(self) -> None:
        self._prefixes: dict[tuple[bytes, int], tuple[float, float, float, float]] = {}
        """(digest of the prompt through the block the prefix ends in, tokens) → (last used,
        first written, seconds without use, seconds at most)."""
        self._sweep_at = float("-inf")
        """When expired prefixes are next dropped (`_sweep`)."""

    def __len__(self) -> int:
        return len(self._prefixes)

    def bill(
        self,
        blocks: Sequence[MirrorBlock],
        *,
        now: float,
        retention: str | None = None,
        keep: bool = True,
    ) -> Predicted:
        """What a request of `blocks` at `now` is billed (no writes: OpenAI bills none)."""
        prefixes = self._prefixes
        if now >= self._sweep_at:
            self._sweep(now)
        idle, most = OPENAI_KEEP.get(retention or "in_memory", OPENAI_KEEP["in_memory"])
        total = sum(b.tokens for b in blocks)
        steps: list[tuple[bytes, int]] = []
        start = 0
        step = OPENAI_FIRST
        for b in blocks:
            end = start + b.tokens
            while step <= end and step < total:  # never the whole prompt: its last token
                steps.append((b.key, step))
                step += OPENAI_STEP
            start = end
        read = 0
        for found in reversed(steps):  # the longest first: the first held is the read
            kept = prefixes.get(found)
            if kept is not None and _alive(kept, now):
                read = found[1]
                break
        if keep:
            for found in steps:
                old = prefixes.get(found)
                if old is None or not _alive(old, now):
                    prefixes[found] = (now, now, idle, most)
                else:
                    prefixes[found] = (now, old[1], max(old[2], idle), max(old[3], most))
        return Predicted(input=total - read, read=read, spans=((read, "read"), (total, "input")))

    def _sweep(self, now: float) -> None:
        """Drop the prefixes expired by `now`. Not on every request: a long session's prompt
        holds a prefix every 128 tokens (~2,000 at turn 300), and walking them all took more
        than the rest of the bill; an expired one still held is never read (`_alive`)."""
        prefixes = self._prefixes
        for k in [k for k, kept in prefixes.items() if not _alive(kept, now)]:
            del prefixes[k]
        self._sweep_at = now + SWEEP_SECONDS

    def forget_before(self, keys: Sequence[bytes]) -> None:
        """As `AnthropicMirror.forget_before`: keep only the prefixes ending in `keys`."""
        wanted = set(keys)
        for k in [k for k in self._prefixes if k[0] not in wanted]:
            del self._prefixes[k]


def _alive(kept: tuple[float, float, float, float], now: float) -> bool:
    """Whether an OpenAI prefix (last used, first written, seconds without use, seconds at
    most) is still held at `now`."""
    used, written, quiet, life = kept
    return now < used + quiet and now < written + life
