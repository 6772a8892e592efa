"""Run `ctxbudget` with its wall clock moved on by what another process writes to a file.

    python -m tests.simclock CLOCK_FILE serve --config PATH --port P

A replay inserts idle gaps of minutes or hours without waiting for them: it moves the
stand-in's `SimClock` and, through `ClockFile.advance`, the proxy's wall clock by the same
seconds, so that whatever the proxy decides from the time since a session's last request (the
prompt cache's lifetime) sees the gap. CLOCK_FILE holds 8 bytes, a little-endian double: the
seconds added to `time.time()` and `time.time_ns()` in the proxy's process, read on every
call. Monotonic time is left alone, so timeouts keep working.
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
import time
from pathlib import Path

_FORMAT = "<d"


class ClockFile:
    """The offset a `python -m tests.simclock` process adds to its wall clock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_bytes(struct.pack(_FORMAT, 0.0))

    @property
    def offset(self) -> float:
        return float(struct.unpack(_FORMAT, self.path.read_bytes())[0])

    def advance(self, seconds: float) -> None:
        """Move the clock on by `seconds` (written in place: the reader maps the file)."""
        fd = os.open(self.path, os.O_WRONLY)
        try:
            os.pwrite(fd, struct.pack(_FORMAT, self.offset + seconds), 0)
        finally:
            os.close(fd)


def install(path: Path) -> None:
    """Make this process's `time.time` and `time.time_ns` read the offset in `path`."""
    with path.open("rb") as f:
        mapped = mmap.mmap(f.fileno(), 8, access=mmap.ACCESS_READ)
    real, real_ns = time.time, time.time_ns

    def offset() -> float:
        return float(struct.unpack_from(_FORMAT, mapped, 0)[0])

    def fake() -> float:
        return real() + offset()

    def fake_ns() -> int:
        return real_ns() + int(offset() * 1e9)

    time.time = fake
    time.time_ns = fake_ns


def main() -> None:
    install(Path(sys.argv[1]))
    from ctxbudget.proxy.cli import main as ctxbudget

    ctxbudget(sys.argv[2:])


if __name__ == "__main__":
    main()
