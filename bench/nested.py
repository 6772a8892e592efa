"""/healthz beside tool results of nested arrays (issue 35): how long other clients wait while
the proxy handles 1 and 4 requests at once, each under 1 MiB with a tool result of
`[[[…]]]` (`"[" + ",".join(["[" * 200 + "]" * 200] * 2600) + "]"`, each with a number of its
own so no clamp cache answers), in every format, budget on and off. Per row: the requests'
time, the polls' median and worst, with the machine's 1-minute load average beside.

The real server (`ctxbudget serve`, one worker) in front of the stand-in upstream (a process
of its own), memories off; a thread polls /healthz every ~10 ms (the bodies are written
before timing starts). Before timing, one ordinary request (tiktoken's tables) and one
nested body (the offload worker's start) are sent. `tests/e2e/test_crafted_text.py` asserts
the bound; this prints the figures for `docs/benchmarks.md`.

    .venv/bin/python bench/nested.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.server import base_config, serve  # noqa: E402
from tests.e2e.test_big_request import quantile, standin_process  # noqa: E402
from tests.e2e.test_crafted_text import AUTH, _nested, _Poller  # noqa: E402

ROUTES = ("/chat/completions", "/messages", "/responses")


def _send(base_url: str, route: str, bodies: list[bytes], budget: str) -> list[int]:
    headers = {**AUTH, "x-context-budget": budget, "x-context-budget-memories": "off"}
    statuses: list[int] = []

    def one(raw: bytes) -> None:
        r = httpx.post(base_url + route, content=raw, headers=headers, timeout=300)
        statuses.append(r.status_code)

    threads = [threading.Thread(target=one, args=(raw,)) for raw in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    return statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="runs per row")
    args = parser.parse_args()
    print("format             budget  in flight  load  requests  polls  median    worst  (not 200)")
    with standin_process() as upstream, tempfile.TemporaryDirectory() as tmp:
        config = base_config(Path(tmp), upstream, enabled=False)
        config["proxy"]["upstream"]["apiKeyEnv"] = None
        config["proxy"]["anthropic"] = {
            "baseUrl": upstream.removesuffix("/v1"),
            "apiKeyEnv": None,
        }
        with serve(Path(tmp), config) as server:
            warm = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi " * 5000}]}
            httpx.post(f"{server.base_url}/chat/completions", json=warm, headers=AUTH, timeout=60)
            first = json.dumps(_nested(ROUTES[0])).encode()
            assert _send(server.base_url, ROUTES[0], [first], "on") == [200]
            for route in ROUTES:
                for budget in ("on", "off"):
                    for flight in (1, 4):
                        for _ in range(args.runs):
                            bodies = [
                                json.dumps(_nested(route), separators=(",", ":")).encode()
                                for _ in range(flight)
                            ]
                            poller = _Poller(server.root)
                            started = time.perf_counter()
                            statuses = _send(server.base_url, route, bodies, budget)
                            took = time.perf_counter() - started
                            waits = poller.stop()
                            print(
                                f"{route:18} {budget:6}  {flight:9}  "
                                f"{os.getloadavg()[0]:4.1f}  {took:6.2f} s  {len(waits):5}  "
                                f"{quantile(waits, 0.5) * 1000:5.1f} ms "
                                f"{max(waits) * 1000:6.0f} ms  "
                                f"{'' if set(statuses) == {200} else sorted(statuses)}"
                            )


if __name__ == "__main__":
    main()
