"""Where a growing conversation's cost goes: the pipeline's own CPU per request around turn
30 and turn 300, split by where it is spent.

One OpenClaw conversation (`bench/_growing.py`) is grown to 310 requests in one process, each
request sent to ctxbudget and then to the floor (`bench/stages.py`'s bare relay), and for the
requests of two windows (turns 20–40 and 285–305) prints the medians of:

- ours, the floor, and the difference (the pipeline's own CPU; the writer thread included);
- the report's writer thread CPU, and garbage collection (wall time of the collections that
  ran during our request, mean);
- each stage function's CPU (`bench/stages.py`'s `STAGE_FUNCTIONS`, children included, so
  nested ones are counted in their callers too).

A function whose cost grows from the first window to the second is one that still works the
whole history each turn (issue 34: turn 300 within 1.3× of turn 30). The wrapping costs ~1 µs
a call; `bench/stages.py --grow` measures without it.

With `--prune`, pruning is on (`contextPruning`, `cache-ttl`, results of 1,000 chars and
more prunable) on a simulated clock: a request every 10 s, and before turn `--prune-at` (15)
an idle gap past the cache's lifetime, so the results older than the last three assistant
turns are pruned then, and every later request (both windows) applies those decisions again.

    .venv/bin/python bench/growth.py chat        # ~40 s
    .venv/bin/python bench/growth.py messages
    .venv/bin/python bench/growth.py messages --prune
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import bench.stages as stages  # noqa: E402

WINDOWS = ((20, 40), (285, 305))
PRUNING = {"mode": "cache-ttl", "ttl": "5m", "minPrunableToolChars": 1000}
"""`--prune`'s `contextPruning`: most of the conversation's 1–4 KB results are prunable."""
STEP_SECONDS, GAP_SECONDS = 10.0, 600.0


class Clock:
    """The app's simulated clock: `STEP_SECONDS` a request, `GAP_SECONDS` once."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


class Collections:
    """Wall time spent in the garbage collector (`gc.callbacks`), in ns, and how many
    collections of each generation ran."""

    def __init__(self) -> None:
        self.spent = 0
        self.runs = [0, 0, 0]
        self._started = 0
        gc.callbacks.append(self._seen)

    def _seen(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter_ns()
        else:
            self.spent += time.perf_counter_ns() - self._started
            self.runs[info["generation"]] += 1


async def grow(fmt: str, turns: int, prune_at: int | None = None) -> None:
    ours_up, floor_up = stages.FakeUpstream(), stages.FakeUpstream()
    clock = Clock()
    if prune_at is None:
        app, _ = stages.bench_app(ours_up)
    else:
        app, _ = stages.bench_app(ours_up, pruning=PRUNING, clock=clock)
    pruned: list[int] = []
    floor = stages.floor_app(floor_up)
    spent: dict[str, int] = {}
    stages.time_functions(spent)
    collections = Collections()
    route, build = stages.BUILDERS[fmt]
    base = "http://127.0.0.1"
    async with app.router.lifespan_context(app):
        for encoding in ("o200k_base", "cl100k_base"):  # loaded once a process (~0.6 s)
            app.state.proxy.tokens.count("warm", encoding)
        async with (
            stages.httpx.AsyncClient(
                transport=stages.httpx.ASGITransport(app=app), base_url=base
            ) as ours,
            stages.httpx.AsyncClient(
                transport=stages.httpx.ASGITransport(app=floor), base_url=base
            ) as bare,
        ):
            seen: dict[str, list[float]] = {}
            # a young collection may run once in ~70 requests: its cost shared over a wider span
            collected_by_turn: deque[int] = deque(maxlen=100)
            for turn, body in enumerate(build(turns), 1):
                window = next((w for w in WINDOWS if w[0] <= turn <= w[1]), None)
                reply = stages.sized_reply(route, len(body))
                clock.now += GAP_SECONDS if turn == prune_at else STEP_SECONDS
                if window is not None and turn == window[0]:
                    seen = {"ours": [], "floor": [], "writer": [], "gc": []}
                    spent.update(dict.fromkeys(spent, 0))
                    collections.runs = [0, 0, 0]
                writer, collected = stages.writer_cpu(), collections.spent
                start = time.process_time()
                await stages.post_one(ours, ours_up, route, body, reply, pruned)
                stages.flush(app)
                middle = time.process_time()
                gc_ns = collections.spent - collected
                collected_by_turn.append(gc_ns)
                await stages.post_one(bare, floor_up, route, body, reply)
                if window is None:
                    continue
                seen["ours"].append(middle - start)
                seen["floor"].append(time.process_time() - middle)
                seen["writer"].append(stages.writer_cpu() - writer)
                seen["gc"].append(gc_ns / 1e9)
                if turn == window[1]:
                    if prune_at is not None:
                        print(f"results pruned in the request of turn {window[1]}: {pruned[-1]}")
                    show(window, len(body), seen, spent)
                    print(
                        f"  collections (young, middle, full): {collections.runs}; objects the "
                        f"collector tracks: {len(gc.get_objects())}; GC over the last "
                        f"{len(collected_by_turn)} requests: "
                        f"{statistics.mean(collected_by_turn) / 1e6:.3f} ms (mean)"
                    )


def show(window: tuple[int, int], size: int, seen: dict[str, list[float]], spent: dict) -> None:
    n = window[1] - window[0] + 1
    mid = {k: statistics.median(v) * 1e3 for k, v in seen.items()}
    print(
        f"turns {window[0]}–{window[1]} ({size // 1000} KB): own {mid['ours'] - mid['floor']:.3f} "
        f"ms (ours {mid['ours']:.3f}, floor {mid['floor']:.3f}); writer thread "
        f"{mid['writer']:.3f}; GC {statistics.mean(seen['gc']) * 1e3:.3f} (mean)"
    )
    for path, ns in spent.items():
        print(f"  {ns / n / 1e6:7.3f} ms  {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("format", choices=sorted(stages.BUILDERS))
    parser.add_argument("--turns", type=int, default=310)
    parser.add_argument("--prune", action="store_true", help="pruning on, a prune early")
    parser.add_argument("--prune-at", type=int, default=15, help="the turn after the idle gap")
    args = parser.parse_args()
    asyncio.run(grow(args.format, args.turns, args.prune_at if args.prune else None))


if __name__ == "__main__":
    main()
