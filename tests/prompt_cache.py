"""The providers' prompt caches and bills, as the stand-in (`tests/standin.py`) plays them.

Ground truth for what ctxbudget's report says: what Anthropic and OpenAI would bill for a
request, given the requests before it and the time between them. Time is a `SimClock` that
moves only when told (`advance`), so a benchmark inserts a 90-minute idle gap without waiting.

A prompt is a run of blocks in the provider's order, each counted with tiktoken's o200k_base
over its canonical JSON (`tokens_of`; a block's `cache_control` marker is not part of it).

**Anthropic Messages** (`AnthropicCache`), as the prompt caching guide describes it:

- up to 4 `cache_control` breakpoints (a fifth is refused by the stand-in, as by the API);
- the prefix up to each breakpoint is cached when it is at least the model's minimum
  (`anthropic_min_tokens`: 1,024 tokens for most models, 2,048 or 4,096 for some) and is kept
  for its marker's `ttl`: 5 minutes by default, 1 hour with `"ttl": "1h"`; each use refreshes
  it for its lifetime again;
- a request reads the longest live prefix that ends at one of the 20 block boundaries the
  API checks for each breakpoint (its own and the 19 before it); the tokens after it up to the last
  cacheable breakpoint are written (each stretch at the lifetime of the breakpoint that ends
  it, `cache_creation.ephemeral_5m_input_tokens` / `ephemeral_1h_input_tokens`), the rest is
  uncached input;
- priced: writes 1.25× input (5 minutes) or 2× (1 hour), reads 0.1×, unless litellm's map
  says otherwise for the model (it does for some: claude-opus-5-5 reads at 0.05×).

**OpenAI** chat completions and Responses (`OpenAICache`), automatic caching:

- a prompt of 1,024 tokens or more is cached in 128-token steps: after a request, every
  prefix of 1,024 + 128·k tokens is kept; a request reads the longest such prefix (never the
  whole prompt: its last token is always computed) written before and still kept;
- kept for 5 minutes without use and at most 1 hour (the "in_memory" retention: OpenAI says
  "5 to 10 minutes of inactivity, always within one hour": the stand-in takes the short end),
  or 24 hours with `prompt_cache_retention: "24h"`;
- requests are routed by `prompt_cache_key`: a prefix cached under one key (or none) is read
  only by requests with the same key (the ~15 requests per minute overflow is not imitated);
- priced: reads at litellm's `cache_read_input_token_cost` for the model (0.5× input for
  gpt-4o, 0.25× for gpt-4.1, 0.1× for the gpt-5 family), no write premium.

`price(model, usage)` is the bill in USD from litellm's offline map (`proxy/report/prices.py`),
computed here from the token classes, not through the proxy's billing code, so the report can
be checked against it. Long-context tiers (above 200 K input tokens) are not imitated.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import threading
from array import array
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from ctxbudget.proxy.report.prices import prices

TTL = Literal["5m", "1h"]
ANTHROPIC_TTL_SECONDS: dict[str, float] = {"5m": 300.0, "1h": 3600.0}
ANTHROPIC_LOOKBACK = 20
"""Block boundaries before a breakpoint where the API looks for a cache hit (the breakpoint's
own included)."""
ANTHROPIC_MAX_BREAKPOINTS = 4
OPENAI_MIN_TOKENS = 1024
OPENAI_STEP = 128
OPENAI_RETENTION: dict[str, tuple[float, float]] = {
    "in_memory": (300.0, 3600.0),
    "24h": (86_400.0, 86_400.0),
}
"""Retention → (seconds a prefix is kept without use, the most seconds it is kept at all)."""

_ANTHROPIC_MINIMUMS = (
    # (substring of the model name, minimum cacheable prefix in tokens), first match wins
    ("opus-4-5", 4096),
    ("opus-4-6", 4096),
    ("opus-5", 4096),
    ("haiku-4-5", 4096),
    ("sonnet-4-6", 2048),
    ("haiku", 2048),
)


def anthropic_min_tokens(model: str) -> int:
    """The shortest prefix Anthropic caches for `model`: 4,096 tokens for Opus 4.5 and later
    and Haiku 4.5, 2,048 for Sonnet 4.6 and the older Haikus, else 1,024.

    >>> anthropic_min_tokens("claude-sonnet-4-5"), anthropic_min_tokens("claude-opus-4-5")
    (1024, 4096)
    """
    for part, minimum in _ANTHROPIC_MINIMUMS:
        if part in model:
            return minimum
    return 1024


class SimClock:
    """Simulated seconds: still until `advance` moves them (thread-safe)."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move time on by `seconds` (not back); the new time."""
        if seconds < 0:
            raise ValueError("the clock does not go back")
        with self._lock:
            self._now += seconds
            return self._now


# --- tokens ---------------------------------------------------------------------------------


def canonical(kind: str, value: Any) -> str:
    """A prompt block as the stand-in counts it: `[kind, value]` as sorted JSON, without the
    block's `cache_control` marker (moving a marker does not change the prefix)."""
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if k != "cache_control"}
    return json.dumps([kind, value], sort_keys=True, ensure_ascii=False)


_TOKEN_COUNTS: dict[str, int] = {}


def tokens_of(text: str) -> int:
    """Tokens of `text` as the stand-in bills them: tiktoken's o200k_base (remembered, as a
    long run resends the same blocks)."""
    found = _TOKEN_COUNTS.get(text)
    if found is None:
        if len(_TOKEN_COUNTS) > 50_000:
            _TOKEN_COUNTS.clear()
        found = len(token_ids(text)) // 4
        _TOKEN_COUNTS[text] = found
    return found


@functools.lru_cache(maxsize=4096)
def token_ids(text: str) -> bytes:
    """`text`'s o200k_base token ids, 4 bytes each (a lone surrogate, which is not UTF-8:
    one made-up token per 4 characters)."""
    try:
        ids = _encoding().encode_ordinary(text)
    except ValueError:
        ids = [0] * (len(text) // 4)
    return array("I", ids).tobytes()


@functools.cache
def _encoding() -> Any:
    """tiktoken's o200k_base, from the BPE file litellm's wheel ships (offline)."""
    if "TIKTOKEN_CACHE_DIR" not in os.environ:
        spec = importlib.util.find_spec("litellm")
        if spec is not None and spec.submodule_search_locations:
            package = Path(next(iter(spec.submodule_search_locations)))
            os.environ["TIKTOKEN_CACHE_DIR"] = str(package / "litellm_core_utils" / "tokenizers")
    import tiktoken

    return tiktoken.get_encoding("o200k_base")


def block_prefixes(blocks: Sequence[tuple[str, Any]]) -> list[tuple[str, int]]:
    """For each block, the digest of the prompt up to and including it, and its tokens."""
    digest = hashlib.sha256()
    size = 0
    out: list[tuple[str, int]] = []
    for kind, block in blocks:
        text = canonical(kind, block)
        digest.update(text.encode(errors="surrogatepass"))
        size += tokens_of(text)
        out.append((digest.hexdigest(), size))
    return out


# --- usage and price ------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptUsage:
    """A request's prompt tokens by how they are billed (output is counted by the caller)."""

    input: int
    """Uncached input."""
    cache_read: int = 0
    cache_write_5m: int = 0
    cache_write_1h: int = 0

    @property
    def total(self) -> int:
        return self.input + self.cache_read + self.cache_write_5m + self.cache_write_1h


@dataclass(frozen=True)
class Rates:
    """USD per token of each class, for one model."""

    input: float
    output: float
    cache_read: float
    cache_write_5m: float
    cache_write_1h: float


def rates(model: str, provider: Literal["anthropic", "openai"]) -> Rates | None:
    """The model's prices from litellm's map; None when the map has no input price.

    Anthropic: writes at the map's prices, else 1.25× input (5 minutes) and 2× (1 hour);
    reads at the map's, else 0.1×. OpenAI: reads at the map's, else at the input price; no
    writes (automatic caching bills none).
    """
    found = prices(model)
    if found is None:
        return None
    entry = _entry(model)
    if provider == "anthropic":
        return Rates(
            input=found.input,
            output=found.output,
            cache_read=_given(entry, "cache_read_input_token_cost", 0.1 * found.input),
            cache_write_5m=_given(entry, "cache_creation_input_token_cost", 1.25 * found.input),
            cache_write_1h=_given(
                entry, "cache_creation_input_token_cost_above_1hr", 2 * found.input
            ),
        )
    return Rates(
        input=found.input,
        output=found.output,
        cache_read=_given(entry, "cache_read_input_token_cost", found.input),
        cache_write_5m=found.input,
        cache_write_1h=found.input,
    )


@functools.cache
def _price_map() -> dict[str, Any]:
    """litellm's offline price map, read from its wheel as the provider's price list: the
    stand-in bills on its own, through no loader of the proxy's."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return {}
    package = Path(next(iter(spec.submodule_search_locations)))
    found = json.loads((package / "model_prices_and_context_window_backup.json").read_text())
    return found if isinstance(found, dict) else {}


def _entry(model: str) -> dict[str, Any]:
    known = _price_map()
    for name in (model, model.rsplit("/", 1)[-1]):
        if isinstance(known.get(name), dict):
            return dict(known[name])
    return {}


def _given(entry: dict[str, Any], key: str, default: float) -> float:
    value = entry.get(key)
    return float(value) if isinstance(value, int | float) and value >= 0 else default


def price(rates: Rates, usage: PromptUsage, output: int) -> float:
    """USD for one request: each token class at its price."""
    return (
        usage.input * rates.input
        + usage.cache_read * rates.cache_read
        + usage.cache_write_5m * rates.cache_write_5m
        + usage.cache_write_1h * rates.cache_write_1h
        + output * rates.output
    )


@dataclass(frozen=True)
class BillLine:
    """One answered request as the provider bills it."""

    route: str
    model: str
    at: float
    """The stand-in's clock when it answered."""
    input: int
    cache_read: int
    cache_write_5m: int
    cache_write_1h: int
    output: int
    usd: float | None
    """None when litellm's map has no price for the model."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def bill_summary(lines: Sequence[BillLine]) -> dict[str, Any]:
    """Totals over `lines`: tokens by class and USD (None if any line is unpriced)."""
    tokens = {
        key: sum(getattr(line, key) for line in lines)
        for key in ("input", "cache_read", "cache_write_5m", "cache_write_1h", "output")
    }
    priced = all(line.usd is not None for line in lines)
    return {
        "requests": len(lines),
        "tokens": tokens,
        "usd": sum(line.usd or 0.0 for line in lines) if priced else None,
    }


# --- Anthropic ------------------------------------------------------------------------------


@dataclass
class _Entry:
    expires: float
    ttl: float
    """Seconds each use keeps it for: 300 or 3,600."""


def marker_ttl(block: Any) -> TTL | None:
    """A block's `cache_control` lifetime ("5m" unless `ttl: "1h"`), or None: no marker."""
    if not isinstance(block, dict) or not block.get("cache_control"):
        return None
    control = block["cache_control"]
    return "1h" if isinstance(control, dict) and control.get("ttl") == "1h" else "5m"


class AnthropicCache:
    """Anthropic's prompt cache for one account, on `clock`."""

    def __init__(self, clock: SimClock) -> None:
        self.clock = clock
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def bill(self, model: str, blocks: Sequence[tuple[str, Any]]) -> PromptUsage:
        """The prompt's tokens by class; the cache afterwards holds what this request wrote
        and refreshed."""
        prefixes = block_prefixes(blocks)
        total = prefixes[-1][1] if prefixes else 0
        marks = [(i, ttl) for i, (_, b) in enumerate(blocks) if (ttl := marker_ttl(b))]
        minimum = anthropic_min_tokens(model)
        with self._lock:
            now = self.clock.now()
            self._expire(now)
            looked = {j for i, _ in marks for j in range(max(0, i - ANTHROPIC_LOOKBACK + 1), i + 1)}
            hits = [j for j in looked if prefixes[j][0] in self._entries]
            hit = max(hits, key=lambda j: prefixes[j][1], default=None)
            read = prefixes[hit][1] if hit is not None else 0
            if hit is not None:
                entry = self._entries[prefixes[hit][0]]
                entry.expires = now + entry.ttl
            written = {"5m": 0, "1h": 0}
            start = read
            for i, ttl in marks:
                digest, end = prefixes[i]
                if end < minimum:
                    continue  # too short to cache: billed as input (or in a later stretch)
                if end > start:
                    written[ttl] += end - start
                    start = end
                self._keep(digest, ANTHROPIC_TTL_SECONDS[ttl], now)
        return PromptUsage(
            input=total - read - written["5m"] - written["1h"],
            cache_read=read,
            cache_write_5m=written["5m"],
            cache_write_1h=written["1h"],
        )

    def _keep(self, digest: str, ttl: float, now: float) -> None:
        entry = self._entries.get(digest)
        if entry is None:
            self._entries[digest] = _Entry(now + ttl, ttl)
        else:
            entry.ttl = max(entry.ttl, ttl)
            entry.expires = now + entry.ttl

    def _expire(self, now: float) -> None:
        gone = [d for d, e in self._entries.items() if e.expires <= now]
        for digest in gone:
            del self._entries[digest]


# --- OpenAI ---------------------------------------------------------------------------------


@dataclass
class _Prefix:
    used: float
    written: float
    idle: float
    most: float


class OpenAICache:
    """OpenAI's automatic prompt cache for one organisation, on `clock`."""

    def __init__(self, clock: SimClock) -> None:
        self.clock = clock
        self._prefixes: dict[bytes, _Prefix] = {}
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._prefixes.clear()

    def bill(
        self,
        parts: Sequence[tuple[str, Any]],
        *,
        key: str | None = None,
        retention: str | None = None,
    ) -> PromptUsage:
        """The prompt's tokens by class (`input` uncached, `cache_read` cached); the cache
        afterwards holds every 128-token step of this prompt from 1,024 tokens on."""
        ids = b"".join(token_ids(canonical(kind, part)) for kind, part in parts)
        total = len(ids) // 4
        idle, most = OPENAI_RETENTION.get(retention or "in_memory", OPENAI_RETENTION["in_memory"])
        route = hashlib.blake2b(f"key:{key}".encode() if key is not None else b"nokey")
        steps: list[tuple[int, bytes]] = []
        fed = 0
        for end in range(OPENAI_MIN_TOKENS, total, OPENAI_STEP):  # never the whole prompt
            route.update(ids[fed * 4 : end * 4])
            fed = end
            steps.append((end, route.copy().digest()))
        with self._lock:
            now = self.clock.now()
            self._expire(now)
            cached = max((end for end, d in steps if d in self._prefixes), default=0)
            for _, digest in steps:
                found = self._prefixes.get(digest)
                if found is None:
                    self._prefixes[digest] = _Prefix(now, now, idle, most)
                else:
                    found.used = now
                    found.idle, found.most = max(found.idle, idle), max(found.most, most)
        return PromptUsage(input=total - cached, cache_read=cached)

    def _expire(self, now: float) -> None:
        gone = [
            d
            for d, p in self._prefixes.items()
            if now >= p.used + p.idle or now >= p.written + p.most
        ]
        for digest in gone:
            del self._prefixes[digest]
