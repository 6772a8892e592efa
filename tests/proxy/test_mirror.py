"""The cache mirror (`proxy/cache/mirror.py`): hand-worked examples of each provider's rules,
and agreement with the billing stand-in (`tests/prompt_cache.py`, written apart) on the
recorded sessions, to the token."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Any

import pytest

from ctxbudget.proxy.cache.mirror import (
    OPENAI_STEP,
    AnthropicMirror,
    MirrorBlock,
    OpenAIMirror,
    Predicted,
)
from ctxbudget.proxy.cache.mirrors import SessionMirror
from tests.prompt_cache import AnthropicCache, OpenAICache, SimClock, canonical, tokens_of
from tests.replay import Schedule, recorded

SONNET = "claude-sonnet-4-5"


def _chain(*blocks: tuple[str, int, str | None]) -> list[MirrorBlock]:
    """Blocks named by letters: a block's key is the names so far (a prefix digest)."""
    out, name = [], ""
    for part, tokens, ttl in blocks:
        name += part
        out.append(MirrorBlock(name.encode(), tokens, ttl))  # type: ignore[arg-type]
    return out


def test_anthropic_writes_only_at_breakpoints_and_reads_the_last_intact_entry() -> None:
    m = AnthropicMirror()
    # system (marked), three turns, the newest marked: OpenClaw's layout
    first = _chain(("s", 3000, "5m"), ("a", 400, None), ("b", 600, "5m"))
    assert m.bill(first, now=0, model=SONNET) == Predicted(input=0, write_5m=4000)
    # next turn: the marker moved to the newest block; the old one still hits in the lookback
    second = _chain(("s", 3000, "5m"), ("a", 400, None), ("b", 600, None), ("c", 500, "5m"))
    assert m.bill(second, now=10, model=SONNET) == Predicted(input=0, read=4000, write_5m=500)
    # a change in block "a" (a prune): nothing stored between the system prompt and it, so
    # the provider reads the system prompt only and writes everything after it again
    pruned = _chain(("s", 3000, "5m"), ("A", 100, None), ("b", 600, None), ("c", 500, None))
    blocks = pruned + [MirrorBlock(b"sAbcd", 300, "5m")]
    assert m.bill(blocks, now=20, model=SONNET) == Predicted(input=0, read=3000, write_5m=1500)


def test_anthropic_lookback_is_20_blocks_and_entries_live_their_ttl_refreshed_on_read() -> None:
    m = AnthropicMirror()
    head = _chain(("s", 2000, "1h"))
    assert m.bill(head, now=0, model=SONNET).write_1h == 2000
    # 25 small blocks after it, the breakpoint on the last: the system entry is 25 back
    far = [head[0]._replace(ttl=None)]
    far += [MirrorBlock(f"s{i}".encode(), 10, None) for i in range(24)]
    far.append(MirrorBlock(b"end", 10, "5m"))
    got = m.bill(far, now=3000, model=SONNET, keep=False)
    assert got.read == 0 and got.write_5m == 2250  # beyond the lookback: all written again
    # read at 3000 s refreshes the 1-hour entry: still there at 6000 s, gone 3600 s after
    assert m.bill(head, now=3000, model=SONNET).read == 2000
    assert m.bill(head, now=6500, model=SONNET).read == 2000
    assert m.bill(head, now=10_200, model=SONNET).read == 0


def test_anthropic_minimum_length_and_at_most_four_breakpoints() -> None:
    m = AnthropicMirror()
    short = _chain(("s", 900, "5m"), ("a", 900, "5m"))
    # the system prompt alone is under 1,024 tokens: not cached; the longer prefix is
    assert m.bill(short, now=0, model=SONNET) == Predicted(input=0, write_5m=1800)
    opus = AnthropicMirror()
    assert opus.bill(short, now=0, model="claude-opus-4-6") == Predicted(input=1800)
    many = _chain(*[(c, 2000, "5m") for c in "abcde"])
    got = AnthropicMirror().bill(many, now=0, model=SONNET)
    assert got == Predicted(input=2000, write_5m=8000)  # a fifth breakpoint counts for nothing


def test_openai_caches_1024_plus_128k_prefixes_per_key() -> None:
    m = OpenAIMirror()
    blocks = _chain(("s", 1500, None), ("a", 700, None))
    assert m.bill(blocks, now=0) == Predicted(input=2200)
    more = [*blocks, MirrorBlock(b"sab", 100, None)]
    # read: the longest 1,024 + 128·k prefix of the earlier prompt, under its 2,200 tokens
    assert m.bill(more, now=60) == Predicted(input=2300 - 2176, read=2176)
    assert m.bill(more, now=60 + 301).read == 0  # five minutes without use: gone


# --- the stand-in, replayed ------------------------------------------------------------------


class _Blocks:
    """The blocks the stand-in bills, as the mirror takes them: a prefix digest of our own,
    the stand-in's token count (tokens are the input, the rules are what is checked).

    A session's request starts with the blocks of the one before it: those equal to them
    (compared, not written out as sorted JSON again: ~1 s of the fast layer's CPU) are the
    last request's blocks, each with the digest of the prefix it ends."""

    def __init__(self, ttl_of: Callable[[Any], str | None]) -> None:
        self._ttl_of = ttl_of
        self._parts: list[tuple[str, Any]] = []
        self._blocks: list[MirrorBlock] = []
        self._digests: list[Any] = []

    def __call__(self, parts: list[tuple[str, Any]]) -> list[MirrorBlock]:
        kept, most = 0, min(len(parts), len(self._parts))
        while kept < most and parts[kept] == self._parts[kept]:
            kept += 1
        digest = self._digests[kept - 1].copy() if kept else hashlib.sha256()
        blocks, digests = self._blocks[:kept], self._digests[:kept]
        for kind, value in parts[kept:]:
            text = canonical(kind, value)
            digest.update(text.encode(errors="surrogatepass"))
            blocks.append(MirrorBlock(digest.digest(), tokens_of(text), self._ttl_of(value)))
            digests.append(digest.copy())
        self._parts, self._blocks, self._digests = list(parts), blocks, digests
        return blocks


def _ttl(value: Any) -> str | None:
    if not isinstance(value, dict) or not value.get("cache_control"):
        return None
    control = value["cache_control"]
    return "1h" if isinstance(control, dict) and control.get("ttl") == "1h" else "5m"


def _hour(data: Any) -> Any:
    """`data` (parsed for the caller alone: changed in place) with every breakpoint asking for
    the 1-hour cache."""
    for value in _walk(data):
        if isinstance(value, dict) and "cache_control" in value:
            value["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    return data


def _walk(value: Any) -> Any:
    yield value
    if isinstance(value, dict):
        for v in value.values():
            yield from _walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v)


SCHEDULES = {
    "cold gaps": Schedule(),
    "always warm, 1 min": Schedule(burst=60.0, gaps=(60.0,)),
}


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("hour", [False, True], ids=["5m", "1h"])
def test_the_anthropic_mirror_bills_a_recorded_session_as_the_stand_in(
    schedule: str, hour: bool
) -> None:
    from tests.standin import _anthropic_blocks

    for session in recorded(["openclaw-messages", "claude-code"]):
        clock = SimClock()
        truth = AnthropicCache(clock)
        mirror = AnthropicMirror()
        blocks_of = _Blocks(_ttl)
        waits = SCHEDULES[schedule].waits(session.requests)
        for i, (wait, r) in enumerate(zip(waits, session.requests, strict=True)):
            clock.advance(wait)
            data = _hour(r.json) if hour else r.json
            parts = _anthropic_blocks(data)
            billed = truth.bill(data["model"], parts)
            got = mirror.bill(blocks_of(parts), now=clock.now(), model=data["model"])
            want = Predicted(
                billed.input, billed.cache_read, billed.cache_write_5m, billed.cache_write_1h
            )
            assert got == want, (session.name, i)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_the_openai_mirror_bills_a_recorded_session_as_the_stand_in(schedule: str) -> None:
    for session in recorded(["openclaw-chat", "codex", "openclaw-responses"]):
        clock = SimClock()
        truth = OpenAICache(clock)
        mirrors: dict[Any, OpenAIMirror] = {}
        blocks_of = _Blocks(lambda _: None)
        off = total = 0
        waits = SCHEDULES[schedule].waits(session.requests)
        for i, (wait, r) in enumerate(zip(waits, session.requests, strict=True)):
            clock.advance(wait)
            data = r.json
            if "messages" in data:
                parts = [("tool", t) for t in data.get("tools") or []]
                parts += [("message", m) for m in data["messages"]]
            else:
                parts = [("instructions", data["instructions"])] if data.get("instructions") else []
                parts += [("tool", t) for t in data.get("tools") or []]
                parts += [("input", item) for item in data.get("input") or []]
            key = data.get("prompt_cache_key")
            retention = data.get("prompt_cache_retention")
            billed = truth.bill(parts, key=key, retention=retention)
            mirror = mirrors.setdefault(key, OpenAIMirror())
            got = mirror.bill(blocks_of(parts), now=clock.now(), retention=retention)
            assert got.total == billed.total, (session.name, i)
            # prefixes are matched block by block: where the client changed the end of a block
            # it sent before, the provider still reads the tokens that block begins with, up
            # to the last 128-token step inside it; the mirror does not (it reads less: a
            # prune it prices is priced high, never low)
            assert 0 <= billed.cache_read - got.read <= OPENAI_STEP, (session.name, i)
            off += billed.cache_read != got.read
            total += 1
        assert off <= total // 10, (session.name, off, total)


def test_an_openai_direct_copy_finds_its_prefixes_after_the_scale_moved() -> None:
    # OpenAI keeps prefixes by token position. The direct copy is never corrected by an
    # answer: when a prune makes the sent prompt denser, each answer's bytes-to-tokens scale
    # moves, and the client's own history must still be found where it was laid out
    mirror = SessionMirror.new("openai")
    history = [(f"b{i}".encode(), 40_000, None) for i in range(10)]

    def ask(blocks: list[Any], now: float, scale: float) -> Any:
        view = mirror.observe(blocks, blocks, now=now, model="gpt-4.1")
        view.settle(view.sent.read, round(scale * sum(n for _, n, _ in blocks)))
        return view

    ask(history, 0, 0.25)
    history.append((b"b10", 400, None))
    ask(history, 60, 0.35)  # the provider counted this prompt denser
    history.append((b"b11", 400, None))
    view = mirror.observe(history, history, now=120, model="gpt-4.1")
    laid = view.direct.total
    # all but the newest block and the last partial step: read
    assert view.direct.read >= laid * (400_400 / 400_800) - 2 * OPENAI_STEP, (view.direct, laid)


# --- the rules replayed from scratch ---------------------------------------------------------


class _Prefixes:
    """OpenAI's rules as written, every prefix of every request held one by one: what a mirror
    that keeps the newest request's prefixes as one chain must bill alike."""

    def __init__(self) -> None:
        self.held: dict[tuple[bytes, int], tuple[float, float, float, float]] = {}

    def bill(self, blocks: list[MirrorBlock], now: float, retention: str | None, keep: bool) -> int:
        idle, most = (86_400.0, 86_400.0) if retention == "24h" else (300.0, 3600.0)
        total = sum(b.tokens for b in blocks)
        steps, start, step = [], 0, 1024
        for b in blocks:
            while step <= start + b.tokens and step < total:
                steps.append((b.key, step))
                step += OPENAI_STEP
            start += b.tokens

        def alive(found: tuple[bytes, int]) -> bool:
            kept = self.held.get(found)
            return kept is not None and now < kept[0] + kept[2] and now < kept[1] + kept[3]

        read = max((n for key, n in steps if alive((key, n))), default=0)
        for found in steps if keep else ():
            old = self.held.get(found)
            if old is not None and alive(found):
                self.held[found] = (now, old[1], max(old[2], idle), max(old[3], most))
            else:
                self.held[found] = (now, now, idle, most)
        return read


class _Entries:
    """Anthropic's rules as written: entries at breakpoints, all expired ones dropped first."""

    def __init__(self) -> None:
        self.held: dict[bytes, tuple[float, float]] = {}

    def bill(self, blocks: list[MirrorBlock], now: float, keep: bool) -> tuple[int, ...]:
        self.held = {k: v for k, v in self.held.items() if v[0] > now}
        ends = [sum(b.tokens for b in blocks[: i + 1]) for i in range(len(blocks))]
        marks = [i for i, b in enumerate(blocks) if b.ttl is not None][:4]
        hits = [
            next((j for j in range(i, max(-1, i - 20), -1) if blocks[j].key in self.held), -1)
            for i in marks
        ]
        hit = max(hits, default=-1, key=lambda j: ends[j] if j >= 0 else -1)
        read = ends[hit] if hit >= 0 else 0
        done, written = read, {"5m": 0, "1h": 0}
        for i in marks:
            if ends[i] >= 1024 and ends[i] > done:
                written[blocks[i].ttl or "5m"] += ends[i] - done
                done = ends[i]
        if keep:
            if hit >= 0:
                life = self.held[blocks[hit].key][1]
                self.held[blocks[hit].key] = (now + life, life)
            for i in marks:
                if ends[i] >= 1024:
                    life = 3600.0 if blocks[i].ttl == "1h" else 300.0
                    old = self.held.get(blocks[i].key)
                    life = max(life, old[1]) if old is not None else life
                    self.held[blocks[i].key] = (now + life, life)
        return read, written["5m"], written["1h"]


@pytest.mark.parametrize("seed", range(8))
def test_a_mirror_kept_between_requests_bills_as_the_rules_replayed_from_scratch(
    seed: int,
) -> None:
    # the mirrors bill a request from what the previous one left (OpenAI: its prefixes as one
    # chain, read and refreshed at once; Anthropic: entries looked up at the breakpoints, the
    # expired swept once a minute). A conversation that grows, is pruned in the middle, goes
    # back to an earlier branch, waits seconds to hours, asks for 24-hour retention, is
    # priced as a what-if or forgets what it held: billed as the rules say, to the token
    rng = random.Random(seed)
    openai, anthropic = OpenAIMirror(), AnthropicMirror()
    prefixes, entries = _Prefixes(), _Entries()
    history: list[tuple[bytes, int]] = [(b"system", 1500)]
    now = 0.0
    for i in range(120):
        move = rng.random()
        if move < 0.6:
            history.append((rng.randbytes(4), rng.randint(1, 900)))
        elif move < 0.7 and len(history) > 2:  # a prune in the middle
            at = rng.randrange(1, len(history))
            history[at] = (rng.randbytes(4), max(1, history[at][1] - rng.randint(0, 300)))
        elif move < 0.8 and len(history) > 2:  # back to an earlier branch
            history = history[: rng.randrange(1, len(history))]
        now += rng.choice([1, 10, 60, 200, 299, 301, 400, 3599, 3601, 7200])
        digest, keys = b"", []
        for name, _ in history:
            digest = hashlib.sha256(digest + name).digest()
            keys.append(digest)
        tokens = [n for _, n in history]
        retention = rng.choice([None, None, None, "24h"])
        keep = rng.random() < 0.85
        blocks = [MirrorBlock(k, n) for k, n in zip(keys, tokens, strict=True)]
        got = openai.bill(blocks, now=now, retention=retention, keep=keep)
        assert got.read == prefixes.bill(blocks, now, retention, keep), (seed, i)
        marked = [None] * len(blocks)
        for at in [0] + [rng.randrange(len(blocks)) for _ in range(rng.randint(0, 3))]:
            marked[at] = rng.choice(["5m", "1h"])
        blocks = [b._replace(ttl=t) for b, t in zip(blocks, marked, strict=True)]
        billed = anthropic.bill(blocks, now=now, model=SONNET, keep=keep)
        want = entries.bill(blocks, now, keep)
        assert (billed.read, billed.write_5m, billed.write_1h) == want, (seed, i)
        if rng.random() < 0.05:  # a miss: what the provider says it read is what it holds
            wanted = [k for k in keys if rng.random() < 0.7]
            openai.forget_before(wanted)
            prefixes.held = {k: v for k, v in prefixes.held.items() if k[0] in wanted}
            anthropic.forget_before(wanted)
            entries.held = {k: v for k, v in entries.held.items() if k in wanted}


def test_an_answer_settled_after_the_next_request_sets_the_scale_from_its_own_bytes() -> None:
    # a streamed answer is settled on the report's writer thread, often after the client's
    # next request was mirrored: its tokens a byte are its own prompt's, not the newest one's
    mirror = SessionMirror.new("anthropic")
    first = [(b"a", 40_000, "5m")]
    second = [(b"a", 40_000, None), (b"ab", 60_000, "5m")]
    early = mirror.observe(first, first, now=0, model=SONNET)
    mirror.observe(second, second, now=60, model=SONNET)
    early.settle(0, 8_000)  # the first prompt: 40,000 bytes, 8,000 tokens
    assert mirror.scale == pytest.approx(0.2)


def test_an_openai_session_is_laid_out_once_however_late_its_first_answer_is_settled() -> None:
    # OpenAI keeps prefixes by token position: the direct copy, which no answer corrects, lost
    # the client's whole history when the first answer, settled late (a stream's, on the
    # writer thread), moved where its steps fall (issue 31: OpenClaw Responses' counterfactual
    # 5% above the direct bill)
    mirror = SessionMirror.new("openai")
    history = [(f"b{i}".encode(), 40_000, None) for i in range(10)]
    views = []
    for i in range(3):
        history.append((f"n{i}".encode(), 400, None))
        views.append(mirror.observe(history, history, now=60.0 * i, model="gpt-4.1"))
    views[0].settle(0, round(0.21 * sum(n for _, n, _ in history[:11])))
    history.append((b"n3", 400, None))
    view = mirror.observe(history, history, now=180, model="gpt-4.1")
    laid = view.direct.total
    assert view.direct.read >= laid * (401_200 / 401_600) - 2 * OPENAI_STEP, (view.direct, laid)
