"""A `Memory` as a store would return it, for tests of recall's pure functions."""

from __future__ import annotations

from ctxbudget.memory import Memory

NOW = 2_000_000_000.0


def memory(
    i: int, text: str | None = None, *, batch: int | None = None, scope: str = "global"
) -> Memory:
    """Memory `i` (text `memory i` unless given), added and last used at `NOW`."""
    return Memory(
        id=i,
        owner="o",
        text=f"memory {i}" if text is None else text,
        category="fact",
        source="inferred",
        scope=scope,
        created=NOW,
        last_accessed=NOW,
        access_count=0,
        batch=batch,
    )
