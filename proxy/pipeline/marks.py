"""The request's phase marks: wall-clock ns at the edges of each phase, in its record's `marks`.

    start ─ parsed ─ clamped ─ recall_start ─ recall_end ─ upstream_start ─ end
     read, parse   clamp   session, prune   recall, observe   headers, record   forward, answer

Telemetry's spans (`proxy/report/telemetry.py`), the metrics' histograms
(`proxy/report/metrics.py`) and bench/stages.py read them. The stages take them through
`timed` alone, as pydantic-ai's `InstrumentedModel` adds telemetry by wrapping, so a stage
reads as what it does. `end` is the record's own: the `Recorder` takes it when the answer is
complete, which for a stream is after the stage that started it returned.
"""

from __future__ import annotations

from time import time_ns
from types import TracebackType


class timed:  # noqa: N801 - used as a statement, like contextlib.suppress
    """Marks `start` when a phase is entered and `end` when it exits cleanly.

    Either may be None: a phase that begins where the last one ended has no start of its own
    (`clamped` follows `parsed`), and one the record ends has no end (`upstream_start`: the
    `Recorder` takes `end`). A phase that raised gets no end: no span claims it finished.
    A class with slots rather than `contextlib.contextmanager`: ~0.4 µs a phase, not ~1.1
    (the two marks written inline: ~0.2).

    >>> marks: dict[str, int] = {}
    >>> with timed(marks, "recall_start", "recall_end"):
    ...     list(marks)
    ['recall_start']
    >>> list(marks)
    ['recall_start', 'recall_end']
    """

    __slots__ = ("_end", "_marks", "_start")

    def __init__(self, marks: dict[str, int], start: str | None = None, end: str | None = None):
        self._marks = marks
        self._start = start
        self._end = end

    def __enter__(self) -> None:
        if self._start is not None:
            self._marks[self._start] = time_ns()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if kind is None and self._end is not None:
            self._marks[self._end] = time_ns()
