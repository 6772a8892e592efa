"""Slow clients against the real server (issue 35, item 7): `ctxbudget serve` with a lowered
file limit (`ulimit -n`, 1,024 by default), and N connections that each send a byte of a
request's headers every few seconds and never finish them. Meanwhile a normal client asks
`/healthz` once a second on a new connection (2 s to answer).

Prints, at each checkpoint, how many slow connections the server still holds open, how many
files the server process has open, and how many `/healthz` polls since the last checkpoint
were answered. `--peers K` spreads the slow connections over K loopback addresses
(127.0.0.2, 127.0.0.3, …): one peer is what the per-client cap
(`proxy.limits.maxConnectionsPerClient`) stops at once; many peers leave it to the header
timeout. Loopback only; bounded counts and time.

    .venv/bin/python bench/slow_clients.py [--connections 1100] [--peers 1] [--seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.server import base_config, serve  # noqa: E402

HEAD = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: "


class Slow:
    """One slow client: a byte of its headers every `interval` seconds, until the server
    closes the connection (or the run ends)."""

    def __init__(self) -> None:
        self.open = False
        self.closed_at: float | None = None

    async def run(self, port: int, source: str, interval: float, until: float) -> None:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)), 10
            )
        except (OSError, TimeoutError):
            return
        self.open = True
        reading = asyncio.ensure_future(reader.read(65536))
        sent = 0
        try:
            while time.monotonic() < until:
                writer.write(HEAD[sent : sent + 1] if sent < len(HEAD) else b"a")
                sent += 1
                done, _ = await asyncio.wait({reading}, timeout=interval)
                if done:  # the server answered or closed: either way this client is done
                    break
        except OSError:
            pass
        finally:
            if reading.done() or time.monotonic() < until:
                self.open = False
                self.closed_at = time.monotonic()
            reading.cancel()
            writer.close()


async def healthz(port: int) -> bool:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 2)
    except (OSError, TimeoutError):
        return False
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 2)
        return answer.startswith(b"HTTP/1.1 200")
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()


def open_files(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


async def attack(args: argparse.Namespace, port: int, pid: int) -> list[dict[str, Any]]:
    start = time.monotonic()
    until = start + args.seconds
    clients = [Slow() for _ in range(args.connections)]
    sources = [f"127.0.0.{2 + i % args.peers}" for i in range(args.connections)]
    tasks = [
        asyncio.ensure_future(c.run(port, s, args.interval, until))
        for c, s in zip(clients, sources, strict=True)
    ]
    rows = []
    polls = answered = 0
    checkpoints = sorted({*args.at, args.seconds})
    for mark in checkpoints:
        while time.monotonic() - start < mark:
            ok = await healthz(port)
            polls, answered = polls + 1, answered + ok
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - start) % 1.0))
        rows.append(
            {
                "t": mark,
                "open": sum(c.open for c in clients),
                "files": open_files(pid),
                "healthz": f"{answered}/{polls}",
            }
        )
        polls = answered = 0
    await asyncio.gather(*tasks)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=1100)
    parser.add_argument("--peers", type=int, default=1, help="loopback source addresses")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between bytes")
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--at", type=int, nargs="*", default=[5, 15, 30, 45], help="checkpoints")
    parser.add_argument("--file-limit", type=int, default=1024, help="the server's ulimit -n")
    args = parser.parse_args()
    if not (1 <= args.connections <= 5000 and 1 <= args.peers <= 250 and args.seconds <= 300):
        raise SystemExit("at most 5,000 connections, 250 peers and 300 s")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, args.connections + 256), hard))
    print(
        f"{args.connections} slow connections from {args.peers} peer(s), a byte every "
        f"{args.interval:g} s; server ulimit -n {args.file_limit}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        config = base_config(Path(tmp), "http://127.0.0.1:9/v1")
        with serve(Path(tmp), config, file_limit=args.file_limit) as server:
            print(f"server pid {server.process.pid}, port {server.port}", flush=True)
            rows = asyncio.run(attack(args, server.port, server.process.pid))
    print("   t  open slow  server files  /healthz answered")
    for r in rows:
        print(f"{r['t']:4}s  {r['open']:9}  {r['files']:12}  {r['healthz']:>17}")


if __name__ == "__main__":
    main()
