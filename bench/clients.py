"""httpx vs aiohttp as the proxy's upstream client, on the proxy's own hot path.

Posts a 170 KB chat request to the stand-in upstream (a separate process on core 1) from this
process (core 0), with each client library, at concurrency 1 and 32, and prints the median
latency and requests/s of each, repeated. This is the measurement behind proxy/upstream/http.py
using aiohttp.

    .venv/bin/python bench/clients.py
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parents[1]
N = 400
PAYLOAD = json.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "x" * 170_000}]}
).encode()
HEADERS = {"content-type": "application/json"}


async def _measure(one: Callable[[], Awaitable[None]], conc: int) -> tuple[float, float]:
    for _ in range(20):
        await one()
    latencies: list[float] = []

    async def timed() -> None:
        t = time.perf_counter()
        await one()
        latencies.append(time.perf_counter() - t)

    start = time.perf_counter()
    for _ in range(0, N, conc):
        await asyncio.gather(*(timed() for _ in range(conc)))
    return statistics.median(latencies) * 1000, N / (time.perf_counter() - start)


async def with_httpx(url: str, conc: int) -> tuple[float, float]:
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(limits=limits) as client:

        async def one() -> None:
            r = await client.post(url, content=PAYLOAD, headers=HEADERS)
            await r.aread()

        return await _measure(one, conc)


async def with_aiohttp(url: str, conc: int) -> tuple[float, float]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100)) as session:

        async def one() -> None:
            async with session.post(url, data=PAYLOAD, headers=HEADERS) as r:
                await r.read()

        return await _measure(one, conc)


def main() -> None:
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {0})
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.standin", "--port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=(lambda: os.sched_setaffinity(0, {1})) if (os.cpu_count() or 1) > 1 else None,
    )
    try:
        assert proc.stdout is not None
        port = next(int(x.split("=")[1]) for x in proc.stdout if x.startswith("STANDIN_PORT="))
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        rows: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for _ in range(3):
            for conc in (1, 32):
                rows.setdefault(("httpx", conc), []).append(asyncio.run(with_httpx(url, conc)))
                rows.setdefault(("aiohttp", conc), []).append(asyncio.run(with_aiohttp(url, conc)))
        print(f"{N} requests of {len(PAYLOAD) / 1000:.0f} KB, median of 3 runs")
        for (name, conc), runs in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            p50 = statistics.median(r[0] for r in runs)
            rps = statistics.median(r[1] for r in runs)
            print(f"  {name:8s} concurrency {conc:2d}: p50 {p50:7.3f} ms, {rps:6.0f} req/s")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
