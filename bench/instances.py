"""Two proxies sharing their state: SQLite files on one host vs one PostgreSQL database.

Starts the stand-in upstream, a throwaway PostgreSQL cluster (`tests/pg.py`), and for each
backend two `ctxbudget serve` processes that share it (the same `report.path` and
`memory.store.path`, or the same `database.url`), with the caps on and 100 memories stored.
Every request is a new conversation (`x-context-budget-session`), so each one recalls and
writes its record. Prints, per backend, the median of the repeats:

- added latency p50 at concurrency 1 (one proxy, against the stand-in directly),
- requests/s and p50/p99 at concurrency 16, spread over both proxies,

    .venv/bin/python bench/instances.py [--quick] [--repeats 3]

The two proxies share core 1, the client and the stand-in core 0 (2-core machines); the
database server runs where the OS puts it, as it would on a shared host.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from overhead import (  # noqa: E402
    BIN,
    HEADERS,
    _free_port,
    _pin,
    pct,
    requests,
    sequential,
    start_standin,
    stop,
)

from tests.pg import postgres_cluster  # noqa: E402

MEMORIES = 100


def start(workdir: Path, upstream: str, shared: dict[str, Any]) -> tuple[Any, str]:
    import subprocess

    config = {
        "proxy": {"upstream": {"baseUrl": upstream, "apiKeyEnv": None}, "logLevel": "warning"},
        "agents": {"defaults": {"contextBudget": {"enabled": True}}},
        **shared,
    }
    path = workdir / f"bench-{_free_port()}.jsonc"
    path.write_text(json.dumps(config))
    port = _free_port()
    proc = subprocess.Popen(
        [str(BIN / "ctxbudget"), "serve", "--config", str(path), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_pin(1),
    )
    root = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{root}/healthz", timeout=1).status_code == 200:
                return proc, root
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError("proxy did not start")


async def spread(roots: list[str], body: bytes, n: int, conc: int) -> tuple[float, list[float]]:
    """`n` requests, `conc` in flight, alternating between the proxies; each a new session."""
    counter = itertools.count()
    lat: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc)) as s:

        async def one() -> None:
            i = next(counter)
            url = f"{roots[i % len(roots)]}/v1/chat/completions"
            headers = {**HEADERS, "x-context-budget-session": f"bench-{i}"}
            t = time.perf_counter()
            async with s.post(url, data=body, headers=headers) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}: {await r.text()}")
            lat.append(time.perf_counter() - t)

        async def worker() -> None:
            while len(lat) < n:
                await one()

        for _ in range(conc):
            await one()
        lat.clear()
        t = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        return len(lat) / (time.perf_counter() - t), lat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n_seq, n_conc = (200, 600) if args.quick else (500, 2000)
    _pin(0)()
    body = requests()[0][1]
    standin, direct = start_standin()
    results: dict[str, dict[str, list[float]]] = {}
    try:
        with postgres_cluster() as cluster, tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            for _ in range(args.repeats):
                for backend in ("sqlite", "postgres"):
                    if backend == "sqlite":
                        shared: dict[str, Any] = {
                            "report": {"path": str(work / f"r-{_free_port()}.db")},
                            "memory": {"store": {"path": str(work / f"m-{_free_port()}.db")}},
                        }
                    else:
                        shared = {
                            "database": {"url": cluster.new_database()},
                            "report": {"path": str(work / f"unused-{_free_port()}.db")},
                            "memory": {"store": {"path": str(work / f"u-{_free_port()}.db")}},
                        }
                    procs = [start(work, direct, shared) for _ in range(2)]
                    roots = [root for _, root in procs]
                    try:
                        notes = [
                            {"text": f"Deploy note {i}: the page fetch needs review {i}"}
                            for i in range(MEMORIES)
                        ]
                        r = httpx.post(f"{roots[0]}/v1/memories", json=notes, timeout=60)
                        assert r.status_code == 201, r.text
                        d = asyncio.run(sequential(direct, body, n_seq))
                        p = asyncio.run(sequential(f"{roots[0]}/v1", body, n_seq))
                        rps, lat = asyncio.run(spread(roots, body, n_conc, 16))
                    finally:
                        for proc, _ in procs:
                            stop(proc)
                    got = results.setdefault(backend, {})
                    got.setdefault("added p50", []).append(pct(p, 0.5) - pct(d, 0.5))
                    got.setdefault("rps", []).append(rps)
                    got.setdefault("c16 p50", []).append(pct(lat, 0.5))
                    got.setdefault("c16 p99", []).append(pct(lat, 0.99))
    finally:
        stop(standin)
    print(f"\nmedian of {args.repeats} repeats; 2 proxies; {MEMORIES} memories; caps on")
    print(f"{'backend':<10} {'added p50 (c1)':>15} {'req/s (c16)':>12} {'p50 (c16)':>10} "
          f"{'p99 (c16)':>10}")  # fmt: skip
    for backend, got in results.items():
        med = {k: statistics.median(v) for k, v in got.items()}
        print(
            f"{backend:<10} {med['added p50'] * 1000:>12.2f} ms {med['rps']:>12.1f} "
            f"{med['c16 p50'] * 1000:>7.1f} ms {med['c16 p99'] * 1000:>7.1f} ms"
        )


if __name__ == "__main__":
    main()
