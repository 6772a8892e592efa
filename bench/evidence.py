"""Evidence kept by the clamps, head vs query (issue 33), and what a query clamp costs.

1. Fetched pages: each LoCoMo conversation (../shared/fixtures/locomo; CC BY-NC 4.0, read in
   place, never copied into the repository) is written out as the web page an agent would
   fetch — a title, one heading per session with its date, one line per dialogue turn — and
   wrapped as OpenClaw's web_fetch result. For each of its questions the request is
   `user: <question>`, `web_fetch {"url": …/conversations/<id>}`, the result; it goes through
   `caps.clamp_request` at the default web-fetch cap (8,000) with each strategy. A question's
   evidence is kept when every turn its `evidence` names is still whole in the clamped text.
2. Failing commands: long outputs (pytest, npm, cargo, make, a Python traceback, a Java stack)
   with the error in the middle, at the default tool-output cap (16,000): is the error line
   still there?
3. Bytes stable: each clamped result again, in a conversation grown by later user turns
   asking other questions (and OpenClaw's internal-context message, new every turn): bytes
   that differ from the first turn's.
4. Milliseconds per clamp (`caps.passages.pick` on the page), and on a 100 KB page.

    .venv/bin/python bench/evidence.py            # all three
    .venv/bin/python bench/evidence.py --json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ctxbudget.caps import Caps, clamp_request  # noqa: E402
from ctxbudget.caps.passages import pick  # noqa: E402
from tests.openclaw import web_fetch_result  # noqa: E402

LOCOMO = ROOT.parent / "shared" / "fixtures" / "locomo"
WEB_CAP = 8000
TOOL_CAP = 16_000
INTERNAL = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nturn {n}\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>"


def conversation_page(data: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """The conversation as a page, and each turn's line by its `dia_id`."""
    a, b = data["speaker_a"], data["speaker_b"]
    lines = [f"# Conversation between {a} and {b}", ""]
    turns: dict[str, str] = {}
    n = 1
    while f"session_{n}" in data:
        lines += ["", f"## Session {n} — {data.get(f'session_{n}_date_time', '')}", ""]
        for turn in data[f"session_{n}"]:
            text = turn["text"]
            if turn.get("blip_caption"):
                text += f" [shares a photo: {turn['blip_caption']}]"
            line = f"{turn['speaker']}: {text}"
            turns[turn["dia_id"]] = line
            lines.append(line)
        n += 1
    return "\n".join(lines) + "\n", turns


def _request(question: str, url: str, result: str, later: list[str]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": f"[Sun 2026-11-22 11:28 UTC] {question}"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "web_fetch", "arguments": json.dumps({"url": url})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": result},
    ]
    for ask in later:
        messages += [
            {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": ask},
        ]
    messages.append({"role": "user", "content": INTERNAL.format(n=len(later))})
    return {"model": "gpt-4o", "messages": messages}


def _clamped_text(request: dict[str, Any], caps: Caps) -> str:
    out = clamp_request(request, caps).request
    tool = next(m for m in out["messages"] if m.get("role") == "tool")
    text: str = json.loads(tool["content"])["text"]
    return text


def pages() -> dict[str, Any]:
    found: dict[str, Any] = {"head": [0, 0], "query": [0, 0], "changed": 0, "turns": 0}
    sizes, times = [], []
    for path in sorted(LOCOMO.glob("*.json")):
        data = json.loads(path.read_text())
        page, turns = conversation_page(data)
        sizes.append(len(page))
        url = f"https://chat.example.com/conversations/{path.stem}"
        result = web_fetch_result(url=url, content=page)
        questions = [q for q in data["qa"] if q.get("evidence") and "question" in q]
        others = [q["question"] for q in questions]
        for i, qa in enumerate(questions):
            evidence = [turns[e] for e in qa["evidence"] if e in turns]
            if not evidence:
                continue
            request = _request(qa["question"], url, result, [])
            for strategy in ("head", "query"):
                text = _clamped_text(request, Caps(web_fetch_max_chars=WEB_CAP, strategy=strategy))
                found[strategy][0] += all(line + "\n" in text for line in evidence)
                found[strategy][1] += 1
                if strategy == "query":
                    first = text
            t0 = time.perf_counter()
            pick(page, WEB_CAP - 1000, qa["question"], how="ask web_fetch for the rest")
            times.append((time.perf_counter() - t0) * 1000)
            if i % 10 == 0:  # the same result in a grown conversation: the same bytes?
                caps = Caps(web_fetch_max_chars=WEB_CAP, strategy="query")
                later = [others[(i + k * 7) % len(others)] for k in range(1, 4)]
                for n in range(1, len(later) + 1):
                    text = _clamped_text(_request(qa["question"], url, result, later[:n]), caps)
                    found["turns"] += 1
                    found["changed"] += sum(x != y for x, y in zip(text, first, strict=False))
                    found["changed"] += abs(len(text) - len(first))
    return {
        "pages": len(sizes),
        "pageChars": sizes,
        "questions": found["query"][1],
        "keptHead": round(100 * found["head"][0] / max(1, found["head"][1]), 1),
        "keptQuery": round(100 * found["query"][0] / max(1, found["query"][1]), 1),
        "laterTurns": found["turns"],
        "bytesChanged": found["changed"],
        "msPerClampMedian": round(statistics.median(times), 2),
        "msPerClampP95": round(sorted(times)[int(0.95 * len(times))], 2),
    }


def _failing(kind: str, size: int, rng: random.Random) -> tuple[str, str, str]:
    """(command, output, the error line) of a long failing run with the error in the middle."""
    if kind == "pytest":
        ok = [f"tests/unit/test_mod{i:04d}.py::test_case_{i} PASSED" for i in range(size // 48)]
        error = "E       AssertionError: assert 41 == 42"
        block = ["    def test_total():", ">       assert total() == 42", error]
        tail = f"===== 1 failed, {len(ok)} passed in 31.02s ====="
        command = "pytest -v tests/unit"
    elif kind == "npm":
        ok = [f"  ✓ renders component {i} ({i % 9} ms)" for i in range(size // 34)]
        error = "npm ERR! Test failed.  See above for more details."
        block = [
            "  ✕ submits the form (12 ms)",
            "    TypeError: Cannot read properties of undefined",
            error,
        ]
        tail = f"Tests: 1 failed, {len(ok)} passed"
        command = "npm test"
    elif kind == "cargo":
        ok = [f"   Compiling crate_{i} v0.{i % 10}.0" for i in range(size // 30)]
        error = "error[E0308]: mismatched types"
        block = [error, "  --> src/parser.rs:88:17", "   |     expected `u32`, found `i64`"]
        tail = "error: could not compile `parser` due to previous error"
        command = "cargo build --release"
    elif kind == "make":
        ok = [f"gcc -O2 -c src/module_{i}.c -o build/module_{i}.o" for i in range(size // 44)]
        error = "src/net.c:212:9: error: 'sockfd' undeclared (first use in this function)"
        block = [error, "make: *** [Makefile:31: build/net.o] Error 1"]
        tail = "make: Target 'all' not remade because of errors."
        command = "make -j4"
    elif kind == "python":
        ok = [f"INFO worker-{i % 8} processed batch {i} in {i % 97} ms" for i in range(size // 42)]
        error = "KeyError: 'customer_id'"
        block = [
            "Traceback (most recent call last):",
            '  File "/srv/app/jobs.py", line 120, in run',
            "    row = rows[key]",
            error,
        ]
        tail = "INFO shutting down"
        command = "python -m app.jobs --all"
    else:  # java
        ok = [f"[INFO] Running com.example.Test{i}" for i in range(size // 34)]
        error = 'java.lang.NullPointerException: Cannot invoke "Order.total()" because "o" is null'
        block = [
            error,
            "\tat com.example.Billing.charge(Billing.java:77)",
            "\tat com.example.Main.main(Main.java:12)",
        ]
        tail = "[INFO] BUILD FAILURE"
        command = "mvn test"
    at = int(len(ok) * rng.uniform(0.25, 0.75))
    lines = ok[:at] + block + ok[at:] + [tail]
    return command, "\n".join(lines) + "\n", error


def commands(count: int = 240) -> dict[str, Any]:
    rng = random.Random(33)
    kept = {"head": 0, "query": 0}
    times = []
    kinds = ("pytest", "npm", "cargo", "make", "python", "java")
    for i in range(count):
        kind = kinds[i % len(kinds)]
        command, output, error = _failing(kind, rng.randrange(30_000, 200_000), rng)
        messages = [
            {"role": "user", "content": "Run the build and tell me what is wrong."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "exec", "arguments": json.dumps({"command": command})},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": output},
        ]
        for strategy in ("head", "query"):
            caps = Caps(tool_output_max_chars=TOOL_CAP, strategy=strategy)
            t0 = time.perf_counter()
            out = clamp_request({"messages": messages}, caps).request["messages"][-1]["content"]
            if strategy == "query":
                times.append((time.perf_counter() - t0) * 1000)
            kept[strategy] += error in out
    return {
        "outputs": count,
        "errorKeptHead": round(100 * kept["head"] / count, 1),
        "errorKeptQuery": round(100 * kept["query"] / count, 1),
        "msPerClampMedian": round(statistics.median(times), 2),
    }


def big_page() -> dict[str, Any]:
    """A 100 KB page: the median of 30 picks."""
    topics = ("weather", "parking", "cycling", "shops", "walks", "birds", "tides", "castles")
    page = "# Island guide\n\n" + "\n\n".join(
        f"Note {i} on {topics[i % 8]}: the council posted an update about {topics[i * 3 % 8]} "
        f"and visitors in season {i % 11}, with times and prices for the summer."
        for i in range(800)
    )
    page = page[:100_000]
    times = []
    for _ in range(30):
        t0 = time.perf_counter()
        pick(page, 7000, "what are the parking prices near the castles in season 7?", how="x")
        times.append((time.perf_counter() - t0) * 1000)
    return {"chars": len(page), "msMedian": round(statistics.median(times), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not LOCOMO.is_dir():
        sys.exit(f"no LoCoMo fixtures at {LOCOMO}")
    found = {"webFetch": pages(), "commands": commands(), "page100k": big_page()}
    if args.json:
        print(json.dumps(found, indent=2))
        return
    web, cmd, big = found["webFetch"], found["commands"], found["page100k"]
    print(
        f"fetched pages ({web['pages']} LoCoMo conversations, {min(web['pageChars']):,}-"
        f"{max(web['pageChars']):,} chars), {web['questions']} questions, cap {WEB_CAP:,}:\n"
        f"  evidence kept: head {web['keptHead']}%  query {web['keptQuery']}%\n"
        f"  later turns replayed: {web['laterTurns']}, bytes changed: {web['bytesChanged']}\n"
        f"  ms per clamp: median {web['msPerClampMedian']}, p95 {web['msPerClampP95']}\n"
        f"failing commands ({cmd['outputs']}, 30-200 KB, error in the middle), cap {TOOL_CAP:,}:\n"
        f"  error line kept: head {cmd['errorKeptHead']}%  query {cmd['errorKeptQuery']}%\n"
        f"  ms per clamp (whole request): median {cmd['msPerClampMedian']}\n"
        f"100 KB page: {big['msMedian']} ms per clamp (median of 30)"
    )


if __name__ == "__main__":
    main()
