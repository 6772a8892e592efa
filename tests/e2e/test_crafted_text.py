"""Crafted text must not freeze the proxy (issue 24): the real server, each crafted body sent
while a thread polls /healthz, and no poll may wait long.

Each body was small or ordinary-looking and held the event loop (or the GIL, from recall's
thread) for seconds, so every other client waited as long:

- a system prompt of repeated `…(truncated ` markers in a `## /w/AGENTS.md` file (240 KB:
  52 s), budget and injection off: the bootstrap check tried every marker to the line's end;
- 25,000 × `a` as the user message with one memory stored (7.6 s): recall's code-term regex;
- a 5 MB user message with memories on (20 s, /healthz up to 0.9 s): recall read all of it;
- 12,700 tiny Responses items under 1 MiB (/healthz 0.2-0.5 s): parsed on the event loop,
  since only the bytes decided what the offload worker takes;
- a 1 MB tool result of nested arrays, `[[[…]]]` (issue 35; /healthz 0.6-1.3 s for one, 2 s
  for four, in every format, budget on or off): only `{` decided the offload, and the tool
  output clamp parsed and walked its ~520,000 lists on the event loop.

The stand-in upstream runs in a process of its own, so parsing these bodies there does not
hold this process's GIL while the poller thread times /healthz. The bound is generous (1 s,
where the stalls were seconds): the machine these tests run on is shared and loaded.
Measured figures are in docs/benchmarks.md ("Crafted text").
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.server import ProxyServer, base_config, serve

ROOT = Path(__file__).resolve().parents[2]
AUTH = {"authorization": "Bearer sk-test", "content-type": "application/json"}
WORST_POLL = 1.0


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


@pytest.fixture(scope="module")
def server(upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyServer]:
    tmp_path = tmp_path_factory.mktemp("crafted")
    config = base_config(tmp_path, upstream, enabled=False)
    config["proxy"]["upstream"]["apiKeyEnv"] = None  # the client's key goes on
    config["proxy"]["anthropic"] = {"baseUrl": upstream.removesuffix("/v1"), "apiKeyEnv": None}
    with serve(tmp_path, config) as running:
        added = httpx.post(
            f"{running.base_url}/memories",
            json={"text": "The zebra project deadline is Friday"},
            timeout=30,
        )
        assert added.status_code == 201, added.text
        # the first token count in a process (of what a clamp would save) loads tiktoken's
        # tables, ~0.5 s once per encoding whatever the body: not what is measured here
        warm = _markers()
        warm["messages"][0]["content"] = warm["messages"][0]["content"][:40_000]
        r = httpx.post(f"{running.base_url}/chat/completions", json=warm, headers=AUTH, timeout=60)
        assert r.status_code == 200, r.text
        yield running


class _Poller:
    """Polls /healthz from a thread until stopped; `waits` holds each poll's time."""

    def __init__(self, root: str) -> None:
        self.waits: list[float] = []
        self._stop = threading.Event()
        self._client = httpx.Client(base_url=root, timeout=120)
        self._client.get("/healthz")  # the connection is open before timing starts
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            assert self._client.get("/healthz").status_code == 200
            self.waits.append(time.perf_counter() - started)
            time.sleep(0.01)

    def stop(self) -> list[float]:
        time.sleep(0.1)  # a poll that would wait behind the request's tail is counted too
        self._stop.set()
        self._thread.join(timeout=120)
        self._client.close()
        return self.waits


def _chat(text: str) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": [{"role": "user", "content": text}]}


def _markers() -> dict[str, Any]:
    system = "# Project Context\nLoaded project context:\n## /w/AGENTS.md\n"
    system += "…(truncated " * (240_000 // len("…(truncated ".encode()))
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "hi"}]
    return {"model": "gpt-4o", "messages": messages}


def _paste(chars: int) -> str:
    """Distinct words, each a term recall would look up."""
    return " ".join(f"w{i}x" for i in range(chars // 8))[:chars]


def _items(count: int) -> dict[str, Any]:
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"m{i}"}]}
        for i in range(count)
    ]
    return {"model": "gpt-4o", "store": False, "input": items}


CASES = {
    # budget and injection off: the bootstrap check still runs, for the report
    "bootstrap-markers-240kb": (
        "/chat/completions",
        _markers,
        {"x-context-budget-memories": "off"},
    ),
    "recall-25000-a": ("/chat/completions", lambda: _chat("a" * 25_000), {}),
    "recall-5mb-message": ("/chat/completions", lambda: _chat(_paste(5_000_000)), {}),
    "responses-12700-items": ("/responses", lambda: _items(12_700), {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_crafted_body_is_answered_and_healthz_never_waits(server: ProxyServer, case: str) -> None:
    route, build, headers = CASES[case]
    raw = json.dumps(build(), ensure_ascii=False, separators=(",", ":")).encode()
    if case == "responses-12700-items":
        assert len(raw) < 1 << 20  # under the bytes threshold: only its items count
    poller = _Poller(server.root)
    started = time.perf_counter()
    r = httpx.post(server.base_url + route, content=raw, headers={**AUTH, **headers}, timeout=300)
    took = time.perf_counter() - started
    waits = poller.stop()
    worst = max(waits)
    print(
        f"\n{case}: {len(raw) / 1000:,.0f} KB answered {r.status_code} in {took:.2f} s; "
        f"{len(waits)} polls, worst {worst * 1000:.0f} ms"
    )
    assert r.status_code == 200, r.text[:500]
    assert waits, "the poller never got an answer"
    assert worst < WORST_POLL, f"/healthz waited {worst:.2f} s while {case} was handled"


NESTED = ",".join(["[" * 200 + "]" * 200] * 2600)
"""The issue's tool result: ~1 MB of arrays 200 deep, ~520,000 of them, and not one `{`."""
_SENT = itertools.count()


def _nested(route: str) -> dict[str, Any]:
    """A tool call and its result, `NESTED` and a number of its own (a clamp's result is kept
    by its text: the same text again would cost nothing), in the format of `route`."""
    ask = "run the dump"
    text = f"[{NESTED},{next(_SENT)}]"
    if route == "/chat/completions":
        call = {"name": "exec", "arguments": '{"command": "dump"}'}
        return {
            "model": "gpt-4o",
            "messages": [
                {"role": "user", "content": ask},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "call_1", "type": "function", "function": call}],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": text},
            ],
        }
    if route == "/messages":
        result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": text}
        return {
            "model": "claude-sonnet-4-5",
            "max_tokens": 64,
            "messages": [
                {"role": "user", "content": ask},
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "exec",
                            "input": {"command": "dump"},
                        }
                    ],
                },
                {"role": "user", "content": [result]},
            ],
        }
    return {
        "model": "gpt-4o",
        "store": False,
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ask}]},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "exec",
                "arguments": '{"command": "dump"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": text},
        ],
    }


@pytest.mark.parametrize("budget", ["on", "off"])
@pytest.mark.parametrize("route", ["/chat/completions", "/messages", "/responses"])
def test_nested_arrays_in_a_tool_result_never_hold_healthz(
    server: ProxyServer, route: str, budget: str
) -> None:
    """Four such bodies at once, under 1 MiB each: /healthz waited 2 s before."""
    bodies = [json.dumps(_nested(route), separators=(",", ":")).encode() for _ in range(4)]
    assert all(len(raw) < 1 << 20 for raw in bodies)  # under the bytes threshold
    headers = {**AUTH, "x-context-budget": budget, "x-context-budget-memories": "off"}
    answers: list[httpx.Response] = []

    def send(raw: bytes) -> None:
        answers.append(
            httpx.post(server.base_url + route, content=raw, headers=headers, timeout=300)
        )

    senders = [threading.Thread(target=send, args=(raw,)) for raw in bodies]
    poller = _Poller(server.root)
    started = time.perf_counter()
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(timeout=300)
    took = time.perf_counter() - started
    waits = poller.stop()
    worst = max(waits)
    print(
        f"\nnested {route} budget {budget}: 4 × {len(bodies[0]) / 1000:,.0f} KB in {took:.2f} s; "
        f"{len(waits)} polls, worst {worst * 1000:.0f} ms"
    )
    assert [a.status_code for a in answers] == [200] * 4, answers[0].text[:500]
    assert waits, "the poller never got an answer"
    assert worst < WORST_POLL, f"/healthz waited {worst:.2f} s beside nested arrays"
