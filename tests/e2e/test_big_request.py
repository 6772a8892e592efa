"""One huge request does not stall anyone else (issue 10, item 2): the real server, a 30 MB
web_fetch result being clamped and counted, and /healthz polled beside it.

The stand-in upstream and the poller run in processes of their own, so what is measured is
the proxy, not this test process's own GIL.

History: clamping and counting on the event loop made /healthz wait seconds (tiktoken alone
held the GIL 2.2 s for the 30 MB text); in a worker thread, worst polls of 58-133 ms, because
single C calls over the one 30 MB string (orjson parsing it, the web_fetch clamp parsing the JSON
inside it, splitting it) hold the GIL for 20-100 ms each. Now a large body is parsed,
clamped, counted, hashed and encoded in the offload process (`proxy/pipeline/offload.py`); what the
event loop still does per 30 MB body is join its chunks (`read_body`) and hand it to the
thread that writes it down the pipe, and that is what a poll can still wait on.

Why not "every poll under 50 ms": on the 2-core shared machine these tests run on, an *idle*
proxy polled the same way showed maxima of 18-91 ms when other work ran (measured when the
offload was first built): one late poll can be the scheduler, not the proxy. Nor a
percentile: the thread version's stalls hit only the 2-3 polls in flight during its
GIL-holding calls, so its p90 was 1-8 ms, as good as now. What tells them apart is how many
polls wait: the thread version had 2-3 polls over 50 ms in 5 of 6 runs (53-133 ms); the
offload at most one in each of 8 runs under load (61 ms the worst) and none in 6 runs on a
quiet machine (21 ms the worst). So the assertion is the issue's 50 ms for every poll but
one (the scheduler's), and no poll over 250 ms (the event-loop version: seconds). It does
not catch every run of the thread version (one in six had a single slow poll); it catches
the event-loop version always. Each run prints its figures (`-s` shows them);
docs/benchmarks.md has the measured ones and the machine's load.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.e2e.server import base_config, serve
from tests.openclaw import openclaw_request, web_fetch_result

ROOT = Path(__file__).resolve().parents[2]
PAGE = ("A paragraph of a very long fetched page, with words. " * 20 + "\n\n") * 28_000
POLL = """
import json, sys, threading, time, httpx
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
waits = []
with httpx.Client(base_url=sys.argv[1], timeout=10) as client:
    client.get("/healthz")  # the connection is open before timing starts
    print("ready", flush=True)
    while not stop.is_set():
        started = time.perf_counter()
        assert client.get("/healthz").status_code == 200
        waits.append(time.perf_counter() - started)
        time.sleep(0.01)
print(json.dumps(waits), flush=True)
"""


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.standin", "--port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    try:
        yield f"http://127.0.0.1:{line.strip().split('=')[1]}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()


def _quantile(waits: list[float], q: float) -> float:
    ordered = sorted(waits)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@pytest.mark.parametrize("enabled", [True, False], ids=["budget-on", "budget-off"])
def test_healthz_answers_promptly_while_a_30_mb_request_is_clamped(
    tmp_path: Path, upstream: str, enabled: bool
) -> None:
    body = openclaw_request(stream=False)
    body["messages"][3]["content"] = web_fetch_result(version="9.x", content=PAGE)
    raw = orjson.dumps(body)
    assert len(raw) > 29_000_000
    with serve(tmp_path, base_config(tmp_path, upstream, enabled=enabled)) as server:
        # the first count in a process loads tiktoken's tables (~0.25 s, once): not measured
        warm = httpx.post(
            f"{server.base_url}/chat/completions", json=openclaw_request(stream=False), timeout=30
        )
        assert warm.status_code == 200
        poller = subprocess.Popen(
            [sys.executable, "-c", POLL, server.root],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert poller.stdin is not None and poller.stdout is not None
        assert poller.stdout.readline().strip() == "ready"
        r = httpx.post(
            f"{server.base_url}/chat/completions",
            content=raw,
            headers={"content-type": "application/json"},
            timeout=120,
        )
        poller.stdin.write("stop\n")
        poller.stdin.flush()
        waits: list[float] = json.loads(poller.stdout.readline())
        poller.wait(timeout=10)
        poller.stdin.close()
        poller.stdout.close()
    assert r.status_code == 200
    saved = "saved" if enabled else "would-save"
    assert int(r.headers[f"x-context-budget-{saved}-chars"]) > 29_000_000
    assert int(r.headers[f"x-context-budget-{saved}-tokens"]) > 6_000_000
    median, p90, worst = (_quantile(waits, q) * 1000 for q in (0.5, 0.9, 1.0))
    print(
        f"\n/healthz beside a 30 MB request (budget {'on' if enabled else 'off'}): "
        f"{len(waits)} polls, median {median:.1f} ms, p90 {p90:.1f} ms, worst {worst:.1f} ms; "
        f"slowest {[round(w * 1000) for w in sorted(waits)[-5:]]}"
    )
    assert len(waits) > 20
    late = [round(w * 1000) for w in waits if w > 0.05]
    assert len(late) <= 1, f"{len(late)} of {len(waits)} polls waited over 50 ms: {late}"
    assert worst < 250, f"/healthz waited {worst:.0f} ms (median {median:.0f}, p90 {p90:.0f})"
