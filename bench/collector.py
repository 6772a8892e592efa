"""What the garbage collector costs a growing conversation: its CPU per request around turn 50
and turn 230, how often each generation ran, and how much a young collection walked.

One OpenClaw conversation (`bench/_growing.py`) is grown to 310 requests through the app
in-process (no floor: nothing else runs), and for turns 1–100 and 150–310 prints the
collector's CPU per request (this thread's, from each collection's start to its end, shared
over the requests of the span), collections of each generation per 100 requests, and a
collection's mean CPU and objects examined. Spans this wide: a young collection runs once in
~70 requests at start-up's threshold (`proxy/app.py`'s `YOUNG_COLLECTION`), so
`bench/growth.py`'s 21-request windows may hold none.

    .venv/bin/python bench/collector.py chat        # ~10 s
    .venv/bin/python bench/collector.py messages --young 700   # Python's default threshold
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import bench.stages as stages  # noqa: E402

SPANS = ((1, 100), (150, 310))


class Collections:
    """Each generation's collections, their CPU (ns) and the objects they examined."""

    def __init__(self) -> None:
        self.runs = [0, 0, 0]
        self.cpu = 0
        self.examined = 0
        self._started = 0
        gc.callbacks.append(self._seen)

    def _seen(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            # the objects of the generations collected: what the collector walks
            self.examined += sum(len(gc.get_objects(g)) for g in range(info["generation"] + 1))
            self._started = time.thread_time_ns()
        else:
            self.cpu += time.thread_time_ns() - self._started
            self.runs[info["generation"]] += 1


async def grow(fmt: str, turns: int, young: int | None) -> None:
    upstream = stages.FakeUpstream()
    app, _ = stages.bench_app(upstream)
    route, build = stages.BUILDERS[fmt]
    seen = Collections()
    async with app.router.lifespan_context(app):
        if young is not None:  # over start-up's policy
            gc.set_threshold(young, *gc.get_threshold()[1:])
        for encoding in ("o200k_base", "cl100k_base"):  # loaded once a process
            app.state.proxy.tokens.count("warm", encoding)
        transport = stages.httpx.ASGITransport(app=app)
        async with stages.httpx.AsyncClient(
            transport=transport, base_url="http://127.0.0.1"
        ) as client:
            shown = []
            for turn, body in enumerate(build(turns), 1):
                span = next((s for s in SPANS if s[0] <= turn <= s[1]), None)
                if span is not None and turn == span[0]:
                    seen.runs, seen.cpu, seen.examined = [0, 0, 0], 0, 0
                reply = stages.sized_reply(route, len(body))
                await stages.post_one(client, upstream, route, body, reply)
                stages.flush(app)
                if span is not None and turn == span[1]:
                    n, runs = span[1] - span[0] + 1, sum(seen.runs)
                    shown.append(
                        f"turns {span[0]}–{span[1]}: GC {seen.cpu / n / 1e3:.1f} µs a request; "
                        f"per 100 requests {', '.join(f'{r * 100 / n:.1f}' for r in seen.runs)} "
                        f"(young, middle, full); {seen.cpu / max(runs, 1) / 1e3:.0f} µs and "
                        f"{seen.examined / max(runs, 1):.0f} objects a collection"
                    )
    print(f"{fmt}, thresholds {gc.get_threshold()}:")
    for line in shown:
        print(" ", line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("format", choices=sorted(stages.BUILDERS))
    parser.add_argument("--turns", type=int, default=310)
    parser.add_argument("--young", type=int, help="the young generation's threshold instead")
    args = parser.parse_args()
    asyncio.run(grow(args.format, args.turns, args.young))


if __name__ == "__main__":
    main()
