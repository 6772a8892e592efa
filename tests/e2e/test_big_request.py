"""One huge request does not stall anyone else (issue 10, item 2): the real server, a 30 MB
web_fetch result being clamped and counted, and /healthz polled beside it.

The stand-in upstream and the poller run in processes of their own, so what is measured is
the proxy, not this test process's own GIL.

Before: clamping and counting ran on the event loop, and /healthz waited seconds (tiktoken
alone held the GIL 2.2 s for the 30 MB text). Now the work runs in a worker thread and tiktoken
counts in pieces; what remains are single C calls over the one 30 MB string (orjson parsing
it, ~40-65 ms on the reference machine). Measured: ~105 ms typical, 257 ms the worst seen on a
busy CI run. The bound here is 1 s, which still fails for the old behaviour (seconds) without
flaking on a loaded machine; the issue's 50 ms needs the parse in another process (noted on
issue 10).
"""

from __future__ import annotations

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
import sys, threading, time, httpx
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
waits = []
with httpx.Client(base_url=sys.argv[1], timeout=10) as client:
    print("ready", flush=True)
    while not stop.is_set():
        started = time.perf_counter()
        assert client.get("/healthz").status_code == 200
        waits.append(time.perf_counter() - started)
        time.sleep(0.01)
print(len(waits), max(waits), flush=True)
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


@pytest.mark.parametrize("enabled", [True, False], ids=["budget-on", "budget-off"])
def test_healthz_answers_within_a_second_while_a_30_mb_request_is_clamped(
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
        polls, worst = poller.stdout.readline().split()
        poller.wait(timeout=10)
        poller.stdin.close()
        poller.stdout.close()
    assert r.status_code == 200
    saved = "saved" if enabled else "would-save"
    assert int(r.headers[f"x-context-budget-{saved}-chars"]) > 29_000_000
    assert int(r.headers[f"x-context-budget-{saved}-tokens"]) > 6_000_000
    assert int(polls) > 20
    assert float(worst) < 1.0, f"/healthz waited {float(worst) * 1000:.0f} ms"
