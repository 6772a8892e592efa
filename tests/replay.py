"""Recorded agent sessions (`bench/sessions/*.jsonl.xz`): the format, and a replay with idle
gaps on a simulated clock.

A recording is what a real agent sent through a whole scripted session (`bench/record.py`):
one JSON line of metadata, then one line per request the agent made — its method, path,
query, headers and body (the exact text) and the task it belongs to — compressed with xz,
which keeps only what each request adds to the one before it. Machine paths are rewritten
(`/home/agent/work` is the workspace) and no credential is in it: the agents ran against a
local stand-in with made-up keys.

`replay` sends the requests again, in order, to a base URL (the stand-in, or the proxy in
front of it), moving the clocks on before each one as a `Schedule` says: a few seconds within
a task (the model answering, the tool running), and the user's idle gaps between tasks. Since
the agent is not re-run, every request is the recorded one, whatever was answered before it.
"""

from __future__ import annotations

import functools
import json
import lzma
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

ROOT = Path(__file__).resolve().parents[1]
SESSIONS = ROOT / "bench" / "sessions"
WORKSPACE = "/home/agent/work"
"""Where the recorded workspace appears to be."""
CHECKOUTS = ROOT.parent if ROOT.parent != ROOT.parent.parent else ROOT
"""Where this machine keeps checkouts of the repository (its folder's parent: worktrees sit
beside it), or the checkout itself at the top of the disk."""
MACHINE_ROOTS = ("/tmp/", "/root/", f"{CHECKOUTS}/")
"""What every path of this machine a recording must not hold starts with."""
MACHINE = re.compile(r"(?<![\w.\-])(?:/tmp/|/root/|" + re.escape(f"{CHECKOUTS}/") + r")[\w.\-/]*")
"""A path of this machine (`MACHINE_ROOTS`), to its end."""
HOP_BY_HOP = {"host", "content-length", "connection", "transfer-encoding", "accept-encoding"}
REPLAY_INDEX = "x-replay-index"
"""A header `replay` adds to each request (its index): the proxy passes it upstream, so the
stand-in tells the replayed requests from those the proxy makes of its own."""


@dataclass(frozen=True)
class Recorded:
    """One request as the agent sent it."""

    task: int | None
    """The user's task (1-based) the request belongs to; None before the first."""
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    @property
    def target(self) -> str:
        return self.path + (f"?{self.query}" if self.query else "")

    @property
    def json(self) -> Any:
        """The body parsed, for the caller alone (it may change it in place)."""
        return _loads(self.body) if self.body else None


@dataclass
class Session:
    """A recording: its metadata (`agent`, `format`, `model`, …) and its requests."""

    meta: dict[str, Any]
    requests: list[Recorded] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.meta["session"])

    @property
    def model(self) -> str:
        return str(self.meta["model"])


def save(path: Path, session: Session) -> int:
    """Write `session` to `path` (xz-compressed JSON lines); its size in bytes."""
    lines = [json.dumps(session.meta, ensure_ascii=False)]
    for r in session.requests:
        entry = {
            "task": r.task,
            "method": r.method,
            "path": r.path,
            "query": r.query,
            "headers": r.headers,
            "body": r.body.decode(),
        }
        lines.append(json.dumps(entry, ensure_ascii=False))
    data = ("\n".join(lines) + "\n").encode()
    filters = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME, "dict_size": 1 << 27}]
    path.write_bytes(lzma.compress(data, format=lzma.FORMAT_XZ, filters=filters))
    return path.stat().st_size


def load(path: Path) -> Session:
    stat = path.stat()
    meta, entries = _entries(path, stat.st_mtime_ns, stat.st_size)
    session = Session(_loads(meta))
    for task, method, target, query, headers, body in entries:
        session.requests.append(Recorded(task, method, target, query, dict(headers), body))
    return session


def _loads(text: str | bytes) -> Any:
    """`json.loads`, at orjson's speed where orjson reads the text (the same objects: each
    recording is parsed a few times a run, ~1 s of the fast layer's CPU with `json`); what it
    refuses (a lone surrogate, an integer past 64 bits) `json` reads."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


@functools.lru_cache(maxsize=8)
def _entries(
    path: Path, mtime_ns: int, size: int
) -> tuple[str, tuple[tuple[Any, str, str, str, tuple[tuple[str, str], ...], bytes], ...]]:
    """`path`'s metadata line, and each request's fields, read once a run (a few tests replay
    each recording, in several schedules: ~0.1 s to decompress, ~0.2 s to parse each time),
    again when the file changes. Immutable: `load` builds each caller a `Session` of its
    own (its headers a dict of its own)."""
    lines = lzma.decompress(path.read_bytes()).decode().splitlines()
    entries = []
    for line in lines[1:]:
        e = _loads(line)
        headers = tuple(e["headers"].items())
        body = e["body"].encode()
        entries.append((e["task"], e["method"], e["path"], e["query"], headers, body))
    return lines[0], tuple(entries)


def recorded(names: Iterable[str] | None = None, folder: Path = SESSIONS) -> list[Session]:
    """The recordings in `folder` (all, or those named), in name order."""
    wanted = set(names) if names is not None else None
    found = []
    for path in sorted(folder.glob("*.jsonl.xz")):
        name = path.name.removesuffix(".jsonl.xz")
        if wanted is None or name in wanted:
            found.append(load(path))
    return found


@dataclass(frozen=True)
class Schedule:
    """When each request is sent: `burst` seconds after the one before it within a task, and
    before each new task the next of `gaps` (seconds, in turn: the user away 2, 10, 30, then
    90 minutes)."""

    burst: float = 8.0
    gaps: tuple[float, ...] = (120.0, 600.0, 1800.0, 5400.0)

    def waits(self, requests: Sequence[Recorded]) -> list[float]:
        """Seconds to wait before each request (0 before the first)."""
        out: list[float] = []
        boundaries = 0
        for i, r in enumerate(requests):
            if i == 0:
                out.append(0.0)
            elif r.task is not None and r.task != requests[i - 1].task:
                out.append(self.gaps[boundaries % len(self.gaps)])
                boundaries += 1
            else:
                out.append(self.burst)
        return out

    def describe(self) -> str:
        minutes = ", ".join(f"{g / 60:g}" for g in self.gaps)
        return f"{self.burst:g} s between a task's requests; {minutes} min idle between tasks"


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    size: int


def replay(
    session: Session,
    root: str,
    advance: Callable[[float], object],
    schedule: Schedule,
    *,
    limit: int | None = None,
    client: httpx.Client | None = None,
) -> list[Reply]:
    """Send `session`'s requests (the first `limit`) to `root` (`http://host:port`), moving
    the clocks on by `advance` before each as `schedule` says; each reply read whole."""
    requests = session.requests[:limit]
    own = client is None
    http = client or httpx.Client(timeout=120)
    replies: list[Reply] = []
    try:
        for wait, r in zip(schedule.waits(requests), requests, strict=True):
            if wait:
                advance(wait)
            headers = {k: v for k, v in r.headers.items() if k.lower() not in HOP_BY_HOP}
            headers[REPLAY_INDEX] = str(len(replies))
            with http.stream(r.method, root + r.target, headers=headers, content=r.body) as got:
                size = sum(len(chunk) for chunk in got.iter_raw())
                replies.append(Reply(got.status_code, dict(got.headers), size))
    finally:
        if own:
            http.close()
    return replies
