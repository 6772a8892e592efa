"""The event loop beside a body that repeats a grown conversation's bytes but does not extend
it (its list's key given again after the list, or not JSON after the old items): how long
the loop is held while the proxy reads it. The conversation grows ~0.9 MB a turn to the size
asked (few objects: one tool result a turn), each turn read in-process as its extension; then
the odd body is sent once, and a 1 ms ticker on the app's own loop records its gaps (the
in-process transport never suspends a /healthz call, so a ticker measures the loop, not
polls). Run it from a checkout to measure that checkout's code:

    .venv/bin/python bench/odd_resend.py [--mb 20] [--runs 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path.cwd()))
from tests.fakes import chat_completion  # noqa: E402
from tests.inproc import close_offloads, config_for, proxy_app, shared_offload  # noqa: E402

TAILS = {
    "key given again": b',"messages":[{"role":"user","content":"hi"}]}',
    "not JSON": b',"x":NaN}',
}


def bodies(target: int) -> list[bytes]:
    messages = [{"role": "system", "content": "s" * 20_000}, {"role": "user", "content": "go"}]
    out: list[bytes] = []
    turn = 0
    while not out or len(out[-1]) < target:
        call = f"call{turn}"
        result = (f"line {turn} " * 100_000)[:900_000]
        function = {"name": "read", "arguments": "{}"}
        messages = [
            *messages,
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": call, "type": "function", "function": function}]},
            {"role": "tool", "tool_call_id": call, "content": result},
        ]  # fmt: skip
        out.append(orjson.dumps({"model": "gpt-4o", "messages": messages}))
        turn += 1
    return out


def one(seq: list[bytes], tail: bytes) -> tuple[int, float, float, int]:
    """(status, the loop's worst gap in ms, the request's ms, worker jobs it took)."""
    with tempfile.TemporaryDirectory() as tmp:
        offload = shared_offload()
        with proxy_app(Path(tmp), config_for(Path(tmp)), offload=offload) as (client, fake):
            for raw in seq:
                fake.answer_json(chat_completion())
                assert client.post("/v1/chat/completions", content=raw).status_code == 200
            odd = seq[-1][:-1] + tail
            fake.answer_json(chat_completion())

            async def run() -> tuple[int, list[float]]:
                task = asyncio.ensure_future(
                    client._client.post("/v1/chat/completions", content=odd)
                )
                gaps = []
                while not task.done():
                    t = time.perf_counter()
                    await asyncio.sleep(0.001)
                    gaps.append(time.perf_counter() - t - 0.001)
                return (await task).status_code, gaps

            jobs = offload.jobs
            start = time.perf_counter()
            status, gaps = client._run(run())
            took = (time.perf_counter() - start) * 1000
            return status, max(gaps) * 1000, took, offload.jobs - jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=20, help="the conversation's size")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    seq = bodies(args.mb << 20)
    print(f"{len(seq)} turns, the last {len(seq[-1]) / 1e6:.1f} MB")
    for name, tail in TAILS.items():
        found = [one(seq, tail) for _ in range(args.runs)]
        worst = statistics.median(f[1] for f in found)
        took = statistics.median(f[2] for f in found)
        print(
            f"{name:16} status {found[0][0]}  loop held (worst gap, median of {args.runs}) "
            f"{worst:6.1f} ms  request {took:5.0f} ms  worker jobs {found[0][3]}"
        )
    close_offloads()


if __name__ == "__main__":
    main()
