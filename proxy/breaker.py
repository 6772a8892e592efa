"""A circuit breaker: after one failure, callers skip a dependency at once, until a check in
the background sees it answer again.

The memory stage uses one for the memory database (`proxy/pipeline/recall.py`): while PostgreSQL
is down, a chat request would otherwise wait the connect timeout for its memories, every
request, and the docs promise an outage costs only the memories.

    breaker = Breaker(lambda: db.execute("SELECT 1"), every=1.0)
    if breaker.down:
        ...                      # go on without it, at once
    try:
        use(db)
    except DatabaseUnavailable:
        breaker.trip()           # the check runs every second on its own thread from now
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("ctxbudget.breaker")


class Breaker:
    """Open (`down`) from `trip()` until `check()` returns without raising; `check` runs on a
    daemon thread every `every` seconds while open, and `recovered(seconds_down)` after it
    passes."""

    def __init__(
        self,
        check: Callable[[], object],
        *,
        every: float,
        recovered: Callable[[float], None] | None = None,
    ) -> None:
        self._check = check
        self._every = every
        self._recovered = recovered
        self._lock = threading.Lock()
        self._since: float | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def down(self) -> bool:
        """Whether to skip the dependency (a failure, and no check has passed since)."""
        return self._since is not None

    def trip(self) -> bool:
        """Note a failure: skip from now on until a check passes. True when this call opened
        the breaker (it was not down already)."""
        with self._lock:
            opened = self._since is None
            if opened:
                self._since = time.monotonic()
            if (self._thread is None or not self._thread.is_alive()) and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._watch, name="ctxbudget-breaker", daemon=True
                )
                self._thread.start()
            return opened

    def close(self) -> None:
        """Stop checking (at shutdown); a check under way finishes on its own."""
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self._check()
            except Exception as exc:  # noqa: BLE001 - still down, whatever it raised
                log.debug("still down: %s", exc)
                continue
            with self._lock:
                since, self._since = self._since, None
                self._thread = None
            if self._recovered is not None and since is not None:
                self._recovered(time.monotonic() - since)
            return
