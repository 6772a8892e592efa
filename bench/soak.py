"""Soak: the proxy under steady load for minutes, with clamps and memory recall on.

Replays the OpenClaw requests (captured ones when present, as in bench/overhead.py) at a fixed
concurrency through `ctxbudget serve` (its own core) to the stand-in upstream, with memories
in the store that the requests' user turns recall, and prints per interval: requests, errors
(any non-2xx or transport failure), p50/p99 latency and the proxy's RSS. Ends with totals.

    .venv/bin/python bench/soak.py                  # 10 minutes, concurrency 32
    .venv/bin/python bench/soak.py --minutes 3 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.overhead import (  # noqa: E402
    _until_up,
    requests,
    rss_mb,
    start_proxy,
    start_standin,
    stop,
)

MEMORIES = [
    "The page fetch tool is slow on intranet pages; prefer cached copies",
    "Memory notes live in MEMORY.md; check it before answering deadline questions",
    "Deadlines are tracked in the team calendar, not in chat",
    "Fetch results over 8k chars get clamped by the context budget",
]


async def _load(
    url: str, bodies: list[bytes], seconds: float, concurrency: int, every: float, pid: int
) -> list[dict[str, float]]:
    rows: list[dict[str, float]] = []
    latencies: list[float] = []
    errors = 0
    done = 0
    end = time.monotonic() + seconds
    lock = asyncio.Lock()

    async def worker(n: int) -> None:
        nonlocal errors, done
        async with aiohttp.ClientSession() as session:
            i = n
            while time.monotonic() < end:
                body = bodies[i % len(bodies)]
                i += concurrency
                started = time.perf_counter()
                try:
                    async with session.post(
                        f"{url}/chat/completions",
                        data=body,
                        headers={"content-type": "application/json"},
                    ) as r:
                        await r.read()
                        ok = r.status < 300
                except aiohttp.ClientError:
                    ok = False
                async with lock:
                    latencies.append(time.perf_counter() - started)
                    done += 1
                    errors += not ok

    async def sampler() -> None:
        nonlocal errors, done
        t0 = time.monotonic()
        while time.monotonic() < end:
            await asyncio.sleep(every)
            async with lock:
                window, count, failed = list(latencies), done, errors
                latencies.clear()
                done = errors = 0
            window.sort()
            row = {
                "t": time.monotonic() - t0,
                "requests": count,
                "errors": failed,
                "p50": window[len(window) // 2] * 1000 if window else 0.0,
                "p99": window[int(len(window) * 0.99)] * 1000 if window else 0.0,
                "rss": rss_mb(pid),
            }
            rows.append(row)
            print(
                f"  {row['t']:6.0f} s  {count:6d} req  {failed:3d} errors  "
                f"p50 {row['p50']:7.2f} ms  p99 {row['p99']:7.2f} ms  RSS {row['rss']:6.1f} MB",
                flush=True,
            )

    await asyncio.gather(sampler(), *(worker(n) for n in range(concurrency)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--every", type=float, default=30, help="seconds per printed row")
    args = parser.parse_args()
    reqs = requests()
    bodies = [body for _, body in reqs]
    print("requests:", ", ".join(f"{name} {len(b) // 1024} KB" for name, b in reqs))
    standin, upstream = start_standin()
    try:
        asyncio.run(_until_up(upstream, bodies[0], standin))
        with tempfile.TemporaryDirectory() as d:
            env = {"CTXBUDGET__MEMORY__STORE__PATH": f"{d}/memory.db"}
            proxy, url, _ = start_proxy(Path(d), upstream, env=env)
            try:
                asyncio.run(_add_memories(url))
                print(
                    f"soak: {args.minutes:g} min at concurrency {args.concurrency}, clamps on, "
                    f"{len(MEMORIES)} memories in the store"
                )
                rows = asyncio.run(
                    _load(url, bodies, args.minutes * 60, args.concurrency, args.every, proxy.pid)
                )
            finally:
                stop(proxy)
    finally:
        stop(standin)
    total = sum(r["requests"] for r in rows)
    failed = sum(r["errors"] for r in rows)
    p99s = [r["p99"] for r in rows]
    print(
        f"total {total} requests, {failed} errors; p99 median over intervals "
        f"{statistics.median(p99s):.2f} ms (max {max(p99s):.2f}); "
        f"RSS first/last {rows[0]['rss']:.1f} / {rows[-1]['rss']:.1f} MB"
    )


async def _add_memories(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        for text in MEMORIES:
            async with session.post(f"{url}/memories", json={"text": text}) as r:
                if r.status != 201:
                    raise RuntimeError(f"adding a memory failed: {r.status} {await r.text()}")


if __name__ == "__main__":
    main()
