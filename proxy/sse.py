"""Server-sent events, split as they are relayed: whole lines and whole events out of chunks
cut anywhere.

The relay passes the upstream's bytes on exactly as they come; what reads them on the way
(the usage reader, the dropper of the usage chunk ctxbudget asked for, the Responses call
watcher) needs whole lines or whole events. Each keeps a `Splitter`, which hands back the
complete part of what it has seen and holds the rest for the next chunk. Splitting runs in C
(`bytes.rfind`, `bytes.split`); nothing is parsed that the reader does not ask for.

>>> lines = Splitter(LINE)
>>> lines.feed(b'data: {"a": 1}\\nda'), lines.feed(b'ta: {"b": 2}\\n'), lines.rest()
(b'data: {"a": 1}\\n', b'data: {"b": 2}\\n', b'')
>>> events = Splitter(EVENT)
>>> events.feed(b"data: 1\\n\\ndata: 2\\r\\n"), events.feed(b"\\r\\n"), events.rest()
(b'data: 1\\n\\n', b'data: 2\\r\\n\\r\\n', b'')
>>> list(data_lines(b'event: x\\ndata: {"usage": 1}\\r\\ndata: [DONE]\\n', b'"usage"'))
[b'{"usage": 1}']
>>> [event_data(e) for e in split_events(b"data: 1\\n\\ndata: 2\\ndata: 3\\r\\n\\r\\ndata: 4")]
[b'1', b'2\\n3', b'4']
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Literal

LINE: Literal["line"] = "line"
EVENT: Literal["event"] = "event"
_EVENT_END = re.compile(rb"\r?\n\r?\n")


class Splitter:
    """Holds what is not yet a whole line (`LINE`) or event (`EVENT`) between chunks."""

    def __init__(self, unit: Literal["line", "event"]) -> None:
        self._unit = unit
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        """The whole lines or events completed by `chunk` (maybe b""), terminators kept."""
        data = self._held + chunk if self._held else chunk
        if self._unit == LINE:
            end = data.rfind(b"\n") + 1
        else:
            lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\n\r\n")
            end = max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)
        self._held = data[end:]
        return data[:end]

    def rest(self) -> bytes:
        """What was held at the end of the stream (a last line or event without its end)."""
        held, self._held = self._held, b""
        return held


def data_lines(lines: bytes, marker: bytes | None = None) -> Iterator[bytes]:
    """The payload of each `data:` line in `lines` (that holds `marker`, when given)."""
    for line in lines.split(b"\n"):
        if marker is not None and marker not in line:
            continue
        line = line.lstrip()
        if line.startswith(b"data:"):
            yield line[5:].strip()


def split_events(data: bytes) -> list[bytes]:
    """`data` cut after each event's blank line (each with its terminator); a last piece
    without one, if any, at the end."""
    out = []
    start = 0
    for match in _EVENT_END.finditer(data):
        out.append(data[start : match.end()])
        start = match.end()
    if start < len(data):
        out.append(data[start:])
    return out


def event_data(event: bytes) -> bytes:
    """One event's data: its `data:` lines' payloads joined with newlines."""
    return b"\n".join(line[5:].strip() for line in event.splitlines() if line.startswith(b"data:"))
