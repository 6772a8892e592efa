"""Peak RSS of `ctxbudget serve` against the one number it is bounded by (issue 34).

Starts the stand-in upstream and `ctxbudget serve` (uvicorn, its own tmp paths, clamps on,
one proxy key per owner), prints the bound `serve` logs at start (`registry.rss_bound`), then
drives many owners × many conversations, each grown turn by turn with large tool results
(a page fetched, a command's output, a file read: 16-64 KB, every one new), chat completions
and Anthropic Messages alternating, until the byte-bounded caches are full: what is sent
(`--rounds` passes, each over fresh conversations) is several times the sum of their bounds.
A few bodies over 1 MiB take the offload worker. Reports the proxy's and its worker's peak
RSS (VmHWM) against the bound, and RSS at each round's end (flat once the caches are full).

    .venv/bin/python bench/rss_bound.py             # 32 owners × 8 conversations × 12 turns, twice
    .venv/bin/python bench/rss_bound.py --rounds 3  # what docs/benchmarks.md shows
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._growing import _text  # noqa: E402
from bench.overhead import BIN, _free_port, rss_mb, start_standin, stop  # noqa: E402
from tests.openclaw import default_files, system_prompt, web_fetch_result  # noqa: E402

KB = 1024


def _status(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out.extend(int(c) for c in text)
    return out


def _result(rng: random.Random, turn: int, size: int) -> tuple[str, dict[str, Any], str]:
    kind = turn % 3
    if kind == 0:
        url = f"https://example.com/docs/{rng.getrandbits(48):x}"
        page = _text(rng, size, "Paragraph ")
        return "web_fetch", {"url": url}, web_fetch_result(url=url, content=page)
    if kind == 1:
        command = f"pytest tests/test_{rng.getrandbits(32):x}.py -q"
        return "exec", {"command": command}, _text(rng, size, "PASSED tests/test_x.py::case ")
    path = f"/home/agent/project/src/module_{rng.getrandbits(32):x}.py"
    return "read", {"path": path}, _text(rng, size, "    def line")


def conversation(
    owner: int, conv: int, turns: int, *, messages: bool, large: bool
) -> list[tuple[str, bytes]]:
    """One conversation's requests, each the last plus a tool call and its (new) result."""
    rng = random.Random(f"{owner}/{conv}")
    system = system_prompt(version="9.x", files=default_files(20_000 + 97 * conv + owner))
    user = f"[Sun 2026-11-28 01:{conv % 60:02d} UTC] Task {owner}.{conv}: work through it."
    history: list[dict[str, Any]] = []
    if not messages:
        history = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    else:
        history = [{"role": "user", "content": [{"type": "text", "text": user}]}]
    out = []
    for turn in range(turns):
        size = rng.randint(16 * KB, 64 * KB)
        if large and turn == turns - 1:
            size = 1200 * KB  # the body goes over 1 MiB: parsed in the offload worker
        name, args, result = _result(rng, turn, size)
        call_id = f"call_{owner}_{conv}_{turn}"
        if not messages:
            history.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": json.dumps(args)},
                        }
                    ],
                }
            )
            history.append({"role": "tool", "tool_call_id": call_id, "content": result})
            body: dict[str, Any] = {"model": "gpt-4o", "messages": history, "stream": False}
            route = "/chat/completions"
        else:
            history.append(
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": call_id, "name": name, "input": args}],
                }
            )
            history.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": call_id, "content": result}],
                }
            )
            body = {
                "model": "claude-sonnet-4-5",
                "max_tokens": 1024,
                "system": [{"type": "text", "text": system}],
                "messages": history,
            }
            route = "/messages"
        out.append((route, json.dumps(body, separators=(",", ":")).encode()))
    return out


def start(workdir: Path, upstream: str, owners: int, connections: int) -> tuple[Any, str, str]:
    """`ctxbudget serve` with one key per owner; its URL and the bound it logged."""
    config = {
        "proxy": {
            "upstream": {"baseUrl": upstream},
            "anthropic": {
                "baseUrl": upstream.removesuffix("/v1"),
                "apiKeyEnv": "BENCH_ANTHROPIC_KEY",
            },
            "logLevel": "info",
            "limits": {"maxConnectionsPerClient": connections},
        },
        "agents": {"defaults": {"contextBudget": {"enabled": True}}},
        "report": {"path": str(workdir / "report.db")},
        "memory": {"store": {"path": str(workdir / "memory.db")}},  # never ~/.ctxbudget
    }
    path = workdir / "bench.jsonc"
    path.write_text(json.dumps(config))
    port = _free_port()
    keys = ",".join(f"owner{n}=key-{n}" for n in range(owners))
    log = (workdir / "serve.log").open("w")
    # this checkout's code, not the installed copy's (`python -m` would find the same)
    serve = "from ctxbudget.proxy.cli import main; main()"
    proc = subprocess.Popen(
        [str(BIN / "python"), "-c", serve, "serve", "--config", str(path), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(workdir),
            "CTXBUDGET_PROXY_KEYS": keys,
            # this checkout's code in the offload worker too: it takes the parent's sys.path,
            # where `python -c`'s "" would not name this directory
            "PYTHONPATH": str(ROOT),
            "BENCH_ANTHROPIC_KEY": "sk-ant-bench",
        },
    )
    url = f"http://127.0.0.1:{port}/v1"
    for _ in range(600):
        text = (workdir / "serve.log").read_text()
        if "Uvicorn running" in text or "Application startup complete" in text:
            break
        if proc.poll() is not None:
            raise RuntimeError("proxy exited during start:\n" + text)
        time.sleep(0.05)
    found = re.search(r"memory: (.*) \(docs", (workdir / "serve.log").read_text())
    return proc, url, found.group(1) if found else "?"


async def drive(
    url: str,
    conversations: list[tuple[int, Callable[[], list[tuple[str, bytes]]]]],
    concurrency: int,
) -> tuple[int, int, int]:
    """Each conversation's requests in order, `concurrency` conversations at a time (each made
    when its turn comes: the bench holds a few, not hundreds of MB); the requests, the errors
    and the bytes sent."""
    queue = list(reversed(conversations))
    done = errors = sent = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal done, errors, sent
        while queue:
            owner, make = queue.pop()
            requests = make()
            headers = {"content-type": "application/json", "authorization": f"Bearer key-{owner}"}
            for route, body in requests:
                async with session.post(url + route, data=body, headers=headers) as r:
                    answer = await r.read()
                    if r.status >= 300:
                        errors += 1
                        if errors == 1:
                            print(f"  first error: {r.status} {answer[:300]!r}", flush=True)
                done += 1
                sent += len(body)

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return done, errors, sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--owners", type=int, default=32)
    parser.add_argument("--conversations", type=int, default=8, help="per owner and round")
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--connections", type=int, default=128, help="maxConnectionsPerClient")
    args = parser.parse_args()
    standin, upstream = start_standin()
    try:
        with tempfile.TemporaryDirectory() as d:
            proxy, url, bound = start(Path(d), upstream, args.owners, args.connections)
            try:
                print(f"bound logged by serve: {bound}")
                print(f"at start: RSS {rss_mb(proxy.pid):.1f} MB")
                started = time.perf_counter()
                for n in range(args.rounds):
                    convs = [
                        (
                            owner,
                            functools.partial(
                                conversation,
                                owner,
                                n * args.conversations + c,
                                args.turns,
                                messages=c % 2 == 1,
                                large=c == 0 and owner % 8 == 0,
                            ),
                        )
                        for c in range(args.conversations)
                        for owner in range(args.owners)
                    ]
                    done, errors, sent = asyncio.run(drive(url, convs, args.concurrency))
                    workers = _children(proxy.pid)
                    print(
                        f"round {n + 1}: {done} requests, {errors} errors, "
                        f"{sent / (1 << 20):,.0f} MB sent; RSS {rss_mb(proxy.pid):.1f} MB"
                        + "".join(f", worker {rss_mb(w):.1f} MB" for w in workers)
                        + f" ({time.perf_counter() - started:.0f} s)",
                        flush=True,
                    )
                peak = _status(proxy.pid, "VmHWM")
                worker_peaks = [_status(w, "VmHWM") for w in _children(proxy.pid)]
                print(
                    f"peak RSS: proxy {peak:.1f} MB"
                    + "".join(f", offload worker {w:.1f} MB" for w in worker_peaks)
                    + f"; bound {bound}"
                )
            finally:
                stop(proxy)
                log = (Path(d) / "serve.log").read_text()
                if "Traceback" in log:  # the server's own failure, for whoever reads the run
                    print(log[log.index("Traceback") :][:3000])
    finally:
        stop(standin)


if __name__ == "__main__":
    main()
