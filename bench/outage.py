"""What a PostgreSQL outage costs a proxy's clients (issue 24): a private throwaway cluster
(`tests/pg.py`), the stand-in upstream, `ctxbudget serve` on `database.url` with
`connectTimeoutSeconds: 2` and one memory stored, and four scenes:

1. **down**: the database stops under a running proxy; 6 chat requests at once, then 6 more,
   then a memory call and the report (503s);
2. **started down**: a proxy starts while the database is down; 6 chat requests at once;
3. **restart**: the database restarts (stop, start) under a proxy whose pool holds several
   connections; then 5 `/v1/memories` calls in a row, and 5 chat requests, each timed;
4. **long outage**: the database is down for 30 s while one proxy serves chats and another
   tried once at its start and then idles; how long until a `/v1/memories` call answers
   again on each, and what the report lost.

Prints, per scene, when each request finished (seconds after they were sent), its status and
whether memories were injected. The stand-in and the client threads share one process: 6 chat
requests at once take ~0.4 s with the database up (the baseline printed first).

`--pruning` (issue 35, item 1) runs what an agent sees instead: `contextPruning` on (a 1 s
cache lifetime, so the real clock expires it), agent sessions whose requests carry tool
results of 8.6 KB before their newest assistant turns (prunable: nearly every request of a
long session), each pruned once after an idle gap; then the database stops, and each session
sends 5 more requests in a row (an idle gap before the 4th: a new prune would be due), while
6 new sessions send their first requests at once. Prints status codes, latency (median and
worst) and whether every result pruned before the outage went out the same way.

    .venv/bin/python bench/outage.py            # ~1.5 minutes
    .venv/bin/python bench/outage.py --pruning  # ~30 s
"""

from __future__ import annotations

import itertools
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.server import ProxyServer, base_config, serve  # noqa: E402
from tests.pg import Cluster, postgres_cluster  # noqa: E402
from tests.standin import StandIn, run_standin  # noqa: E402

SESSIONS = itertools.count()
ASK = {"model": "gpt-4o", "messages": [{"role": "user", "content": "when is the zebra deadline?"}]}


def config(folder: Path, standin: StandIn, url: str) -> dict[str, Any]:
    found = base_config(folder, standin.base_url)
    found["proxy"]["upstream"]["apiKeyEnv"] = None
    found["database"] = {"url": url, "connectTimeoutSeconds": 2}
    return found


def chat(server: ProxyServer, sent: float) -> str:
    # a new conversation each time, so each one recalls (a session places its block again)
    session = {"x-context-budget-session": f"s{next(SESSIONS)}"}
    reply = httpx.post(f"{server.base_url}/chat/completions", json=ASK, headers=session, timeout=60)
    memories = reply.headers.get("x-context-budget-memories", "-")
    return f"{time.monotonic() - sent:5.2f}s {reply.status_code} memories={memories}"


def at_once(server: ProxyServer, n: int = 6) -> list[str]:
    sent = time.monotonic()
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: chat(server, sent), range(n)))


def memory_call(server: ProxyServer) -> str:
    sent = time.monotonic()
    reply = httpx.get(f"{server.base_url}/memories", timeout=60)
    return f"{time.monotonic() - sent:5.2f}s {reply.status_code}"


def report_call(server: ProxyServer) -> str:
    sent = time.monotonic()
    reply = httpx.get(f"{server.root}/context/budget", timeout=60)
    return f"{time.monotonic() - sent:5.2f}s {reply.status_code}"


def settled_report(server: ProxyServer) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        reply = httpx.get(f"{server.root}/context/budget", timeout=60)
        if reply.status_code == 200 or time.monotonic() > deadline:
            data: dict[str, Any] = reply.json()
            return data
        time.sleep(0.5)


def scene(title: str, lines: list[str]) -> None:
    print(f"\n{title}")
    for line in lines:
        print("  " + line)


def main() -> None:
    with ExitStack() as stack:
        standin = stack.enter_context(run_standin(record=False))
        cluster: Cluster = stack.enter_context(postgres_cluster())
        url = cluster.new_database()
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        folder = tmp / "a"
        folder.mkdir()
        server = stack.enter_context(serve(folder, config(folder, standin, url)))
        httpx.post(f"{server.base_url}/memories", json={"text": "The zebra deadline is Friday"})
        at_once(server)  # the first requests load tiktoken and open the stores
        scene("database up: 6 at once (the baseline)", at_once(server))

        cluster.stop()
        scene("1. down: 6 at once", at_once(server))
        scene("1. down: 6 more at once", at_once(server))
        scene("1. down: a memory call, the report", [memory_call(server), report_call(server)])

        late = tmp / "b"
        late.mkdir()
        second = stack.enter_context(serve(late, config(late, standin, url)))
        scene("2. started down: 6 at once", at_once(second))
        scene("2. started down: 6 more at once", at_once(second))
        cluster.start()
        time.sleep(3)  # let the first proxy see it again

        # several connections in the pool, then a restart
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda _: memory_call(server), range(16)))
        before = settled_report(server)
        cluster.stop()
        cluster.start()
        scene("3. restart: 5 memory calls in a row", [memory_call(server) for _ in range(5)])
        scene("3. restart: 5 chats in a row", [chat(server, time.monotonic()) for _ in range(5)])
        after = settled_report(server)
        scene(
            "3. restart: the report",
            [
                f"requests {before['totals']['requests']} -> {after['totals']['requests']}"
                f" (+5 expected), lost {before['lost']} -> {after['lost']}"
            ],
        )

        cluster.stop()
        stopped = time.monotonic()
        memory_call(second)  # tries once, then idles through the outage
        sent = 0
        while time.monotonic() - stopped < 30:
            chat(server, time.monotonic())
            sent += 1
            time.sleep(0.5)
        cluster.start()
        started = time.monotonic()
        lines = []
        for name, which in (("serving", server), ("idle", second)):
            while " 200" not in memory_call(which) and time.monotonic() - started < 120:
                time.sleep(0.2)
            lines.append(
                f"{name} proxy: first memory call answered {time.monotonic() - started:.1f}s"
                " after the start"
            )
        final = settled_report(server)
        lines.append(
            f"{sent} chats during 30 s down: report requests {after['totals']['requests']} ->"
            f" {final['totals']['requests']}, lost {after['lost']} -> {final['lost']}"
        )
        scene("4. long outage", lines)


def tool_session(turns: int, name: str) -> dict[str, Any]:
    """An agent session's request: `turns` tool calls, each answered with 8.6 KB."""
    output = "".join(f"line {i}: " + "ok " * 20 + "\n" for i in range(120))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"[{name}] fix the failing test"},
    ]
    for i in range(turns):
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": "exec", "arguments": '{"cmd": "pytest"}'}}  # fmt: skip
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": f"run {i}\n{output}"},
        ]
    return {"model": "gpt-4o", "messages": messages}


def tool_call(server: ProxyServer, standin: StandIn, turns: int, name: str) -> tuple[Any, ...]:
    """Status, seconds, the pruning-skipped header, and the tool results the stand-in got."""
    sent = time.monotonic()
    reply = httpx.post(
        f"{server.base_url}/chat/completions", json=tool_session(turns, name), timeout=60
    )
    took = time.monotonic() - sent
    got = {}
    if reply.status_code == 200:
        body = standin.received[-1].json
        got = {m["tool_call_id"]: m["content"] for m in body["messages"] if m["role"] == "tool"}
    return reply.status_code, took, reply.headers.get("x-context-budget-pruning-skipped"), got


def pruning() -> None:
    with ExitStack() as stack:
        standin = stack.enter_context(run_standin())  # recorded: what went upstream
        cluster: Cluster = stack.enter_context(postgres_cluster())
        url = cluster.new_database()
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        found = config(folder, standin, url)
        found["agents"]["defaults"]["contextPruning"] = {"ttl": "1s"}
        found["memory"]["inject"] = {"enabled": False}
        server = stack.enter_context(serve(folder, found))
        names = [f"agent {i}" for i in range(4)]
        for name in names:
            tool_call(server, standin, 6, name)
        time.sleep(1.5)  # an idle gap: each session's next request prunes call_0-call_2
        held: dict[str, dict[str, str]] = {}
        for name in names:
            *_, got = tool_call(server, standin, 7, name)
            held[name] = {i: t for i, t in got.items() if "tool result pruned" in t}
        up = [tool_call(server, standin, 8, name) for name in names]
        cluster.stop()
        time.sleep(1.2)  # past what a worker trusts of its last read
        during: list[tuple[Any, ...]] = []
        same = pruned_new = 0
        for turns in range(9, 14):
            if turns == 12:
                time.sleep(1.5)  # another idle gap: call_4-call_7 would be pruned now
            for name in names:
                status, took, header, got = tool_call(server, standin, turns, name)
                during.append((status, took, header))
                if status == 200:
                    same += all(got[i] == t for i, t in held[name].items())
                    pruned_new += sum(
                        "tool result pruned" in t for i, t in got.items() if i not in held[name]
                    )
        with ThreadPoolExecutor(6) as pool:
            fresh = list(
                pool.map(lambda i: tool_call(server, standin, 8, f"new {i}")[:3], range(6))
            )
        cluster.start()

        def line(title: str, rows: list[tuple[Any, ...]]) -> str:
            codes = Counter(r[0] for r in rows)
            times = sorted(r[1] for r in rows)
            headers = Counter(r[2] for r in rows if r[2])
            return (
                f"{title}: {dict(codes)}, median {times[len(times) // 2] * 1000:.0f} ms, "
                f"worst {times[-1] * 1000:.0f} ms"
                + (f", pruning-skipped {dict(headers)}" if headers else "")
            )

        scene(
            "pruning: 4 agent sessions, results of 8.6 KB, pruned once before the outage",
            [
                line("database up, 4 requests", up),
                line(f"database down, {len(during)} requests in a row", during),
                f"  pruned results sent as before: {same} of {sum(r[0] == 200 for r in during)}"
                f" answered requests; results pruned anew during the outage: {pruned_new}",
                line("database down, 6 new sessions at once", fresh),
            ],
        )


if __name__ == "__main__":
    pruning() if "--pruning" in sys.argv[1:] else main()
