"""The house, walked: which of our modules one request goes through on the event loop, and how
often it moves between them and between rooms (issue 34's "before and after").

One OpenClaw conversation (`bench/_growing.py`) is grown to `--turns` requests through the
in-process app; the last request is traced with `sys.setprofile` (this thread only: the event
loop's; the report's writer thread and the offload worker are not walked). Every Python call
into a module of ours from another module of ours is a move (other libraries' frames between
them are skipped: a call through Starlette counts once, from our caller). A module's room is
its package below `ctxbudget.proxy` (`wire`, `cache`, `pipeline`, ...), or `caps`, or
`memory`.

    .venv/bin/python bench/walk.py                      # Messages, turn 40
    .venv/bin/python bench/walk.py --format chat --turns 300
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._growing import BUILDERS  # noqa: E402
from bench.stages import HEADERS, sized_reply  # noqa: E402
from ctxbudget.proxy.app import create_app  # noqa: E402
from ctxbudget.proxy.config.schema import ConfigSource  # noqa: E402
from tests.fakes import FakeUpstream  # noqa: E402

OURS = ("ctxbudget.",)


def room(module: str) -> str:
    """`ctxbudget.proxy.wire.chat` → `wire`; `ctxbudget.proxy.tokens` → `tokens`;
    `ctxbudget.caps.clamp` → `caps`."""
    parts = module.split(".")
    if parts[1] != "proxy":
        return parts[1]
    return parts[2] if len(parts) > 2 else "proxy"


def _ours(frame: FrameType | None) -> str | None:
    """The module of the nearest frame of ours (a call into httpx from our code stays ours)."""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.startswith(OURS):
            return str(name)
        frame = frame.f_back
    return None


class Walk:
    """The calls of one request between modules of ours: each call's caller and callee."""

    def __init__(self) -> None:
        self.modules: set[str] = set()
        self.calls: list[tuple[str, str]] = []
        """(caller, callee) of every call from one module of ours into another."""

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        if not callee.startswith(OURS):
            return
        self.modules.add(callee)
        caller = _ours(frame.f_back)
        if caller is not None and caller != callee:
            self.calls.append((caller, callee))


def summary(walk: Walk) -> dict[str, Any]:
    across = [(room(a), room(b)) for a, b in walk.calls]
    pairs = Counter(tuple(sorted(p)) for p in across if p[0] != p[1])
    return {
        "modules": len(walk.modules),
        "rooms": len({room(m) for m in walk.modules}),
        "calls between modules": len(walk.calls),
        "calls between rooms": sum(pairs.values()),
        "most calls between two rooms": {f"{a}↔{b}": n for (a, b), n in pairs.most_common(6)},
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=sorted(BUILDERS), default="messages")
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    route, build = BUILDERS[args.format]
    bodies = build(args.turns)
    tmp = Path(tempfile.mkdtemp(prefix="ctxbudget-walk-"))
    config = {
        "agents": {"defaults": {"contextBudget": {"enabled": True}}},
        "memory": {"store": {"path": str(tmp / "memory.db")}},
        "report": {"path": str(tmp / "report.db")},
    }
    (tmp / "ctxbudget.json").write_text(json.dumps(config))
    upstream = FakeUpstream()
    app = create_app(ConfigSource(tmp / "ctxbudget.json", {}, {}), upstream=upstream, env={})
    walk = Walk()
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            for i, body in enumerate(bodies):
                upstream.answer_json(sized_reply(route, len(body)))
                last = i == len(bodies) - 1
                if last:
                    sys.setprofile(walk)
                try:
                    r = await client.post(route, content=body, headers=HEADERS[route])
                finally:
                    sys.setprofile(None)
                if r.status_code != 200:
                    raise SystemExit(f"{r.status_code}: {r.text[:300]}")
    found = summary(walk)
    if args.json:
        print(json.dumps(found))
        return
    size = len(bodies[-1])
    print(f"{args.format}, request {args.turns} ({size:,} bytes), on the event loop:")
    for key, value in found.items():
        print(f"  {key}: {value}")


if __name__ == "__main__":
    asyncio.run(main())
