"""What a cache keeps, as a caller sees it: the memory still held after work whose results are
gone, measured with tracemalloc, against the bound `proxy/cache/registry.py` documents.

    with held() as kept:
        for i in range(100):
            clamp(a_new_1_mb_text(i))  # each result dropped at once
    assert kept.bytes <= bound_of("caps/memo.py:bodies") + SLACK

A test that reads a cache's private weight checks the cache's own arithmetic; this checks what
an operator relies on, the process's memory, and survives the cache being rebuilt.
"""

from __future__ import annotations

import gc
import re
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager

from ctxbudget.proxy.cache.registry import CACHES

SLACK = 2 << 20
"""What the measurement itself and the interpreter's own growth may add (free lists, a dict
resized, the loop's locals): small beside the bounds checked, 8 MB and more."""


def bound_of(where: str) -> int:
    """The bound, in bytes, the registry documents for the cache at `where` (`path:name`)."""
    [cache] = [c for c in CACHES if c.where == where]
    found = re.fullmatch(r"(\d+) MB", cache.bound)
    if found is None:
        raise ValueError(f"{where} is bounded by {cache.bound!r}, not in MB")
    return int(found.group(1)) << 20


class Held:
    """What `held` measured."""

    bytes = 0
    """Allocated inside the block and still alive at its end, after a full collection."""


@contextmanager
def held() -> Iterator[Held]:
    """Measures what the block's work left alive (what caches kept of it): the block should
    drop its own results (`del`), or they count too."""
    found = Held()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        yield found
        gc.collect()
        found.bytes = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
