"""The cache mirrors kept per owner and session (`proxy/cache/mirrors.py`), as another key
holder would attack them (round 36)."""

from __future__ import annotations

import time

from ctxbudget.proxy.cache.mirrors import Mirrors
from ctxbudget.proxy.cache.sessions import Block


def _request(n: int) -> list[Block]:
    message = {"role": "user", "content": f"hello {n}"}
    return [Block("messages[0]", message, message)]


def test_reading_whether_a_session_is_paused_never_walks_every_owners_mirrors() -> None:
    # The report asks for each session it shows (20) whether its warm pruning is paused: each
    # question walked every mirror of every owner, and one key's new session ids make up to
    # 131,072 (64 MB of 512-byte mirrors): 0.4 s per report read, on the event loop.
    mirrors = Mirrors()
    for n in range(60_000):
        mirrors.observe("bob", f"s{n}", "openai", _request(n), now=0.0, model="gpt-4o")
    mirrors.observe("alice", "mine", "openai", _request(0), now=0.0, model="gpt-4o")
    start = time.perf_counter()
    for n in range(20):
        assert mirrors.paused("alice", f"s{n}") is None  # bob's session of that id: not hers
        assert mirrors.paused(None, f"s{n}") is None
    took = time.perf_counter() - start
    assert took < 0.02, f"{took * 1000:.0f} ms"


def test_one_owners_flood_of_sessions_pushes_out_its_own_mirrors_not_anothers() -> None:
    # One LRU over every owner's mirrors let a key holder's new session ids push out everyone
    # else's: their sessions were mirrored cold again, and a session whose bill had paused
    # its warm pruning (`pruningPaused`) was pruned again. As with the sessions (issue 24),
    # the owner holding the most bytes gives way.
    mirrors = Mirrors(keep_bytes=200_000)
    mirrors.observe("alice", "mine", "openai", _request(0), now=0.0, model="gpt-4o")
    for n in range(2_000):
        mirrors.observe("bob", f"s{n}", "openai", _request(n), now=0.0, model="gpt-4o")
    assert mirrors.get("alice", "mine") is not None
    assert mirrors.get("bob", "s1999") is not None
    assert mirrors.get("bob", "s0") is None  # bob's own oldest went
