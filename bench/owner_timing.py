"""Can key B time whether key A sent a text? (issue 35, item 6)

Through the real app in-process (the ASGI app, a canned upstream, two proxy keys, budget on):
for each trial, key A sends a request with a fresh 100 KB tool result; then key B sends the
very same request, and a request with another fresh 100 KB text, in turn order shuffled, and
times both. Caches found by the text alone made B's copy of A's text faster (the clamp and
the token count were found); keyed by owner, both cost the same. Prints the medians and their
ratio (fresh / same: 1.0 means nothing to see).

    .venv/bin/python bench/owner_timing.py            # 40 trials
    .venv/bin/python bench/owner_timing.py --trials 10
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.inproc import config_for, proxy_app  # noqa: E402
from tests.openclaw import openclaw_request, web_fetch_result  # noqa: E402

KEYS = {"CTXBUDGET_PROXY_KEYS": "alice=ka-1,bob=kb-2"}
A, B = {"authorization": "Bearer ka-1"}, {"authorization": "Bearer kb-2"}


def _text(rng: random.Random, chars: int = 100_000) -> str:
    words = [f"w{rng.getrandbits(40):x}" for _ in range(chars // 12)]
    return " ".join(words)[:chars]


def _body(text: str) -> dict[str, Any]:
    body = openclaw_request(stream=False, web_chars=200)
    body["messages"][3]["content"] = web_fetch_result(content=text)
    return body


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=40)
    args = parser.parse_args()
    rng = random.Random(35)
    same: list[float] = []
    fresh: list[float] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        proxy_app(Path(tmp), config_for(Path(tmp)), env=KEYS) as (client, _),
    ):
        for _ in range(3):  # warm: imports, tiktoken's tables, the first request's work
            client.post("/v1/chat/completions", json=_body(_text(rng)), headers=B)
        for _ in range(args.trials):
            secret = _body(_text(rng))
            other = _body(_text(rng))
            assert client.post("/v1/chat/completions", json=secret, headers=A).status_code == 200
            order = [("same", secret), ("fresh", other)]
            rng.shuffle(order)
            for name, body in order:
                start = time.perf_counter()
                r = client.post("/v1/chat/completions", json=body, headers=B)
                took = time.perf_counter() - start
                assert r.status_code == 200
                (same if name == "same" else fresh).append(took * 1000)
    s, f = statistics.median(same), statistics.median(fresh)
    print(f"trials {args.trials}: B's copy of A's text {s:.2f} ms, a fresh text {f:.2f} ms")
    print(f"ratio of medians (fresh / same): {f / s:.2f}")


if __name__ == "__main__":
    main()
