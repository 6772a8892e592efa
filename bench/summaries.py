"""What pruning's summaries (`contextPruning.summarize`) send upstream (issue 35 item 4):
`ctxbudget serve` in front of the stand-in, summaries on (`gpt-4o-mini`, `minChars` 4,000),
two sessions of an agent whose tool results are ~16 KB each:

1. **unknown model**: the agent's model is one the provider does not know (the stand-in
   answers 404, `x_standin.status`), and the agent sends its 40-result session 10 times;
2. **normal session**: 30 requests, each the one before plus a tool turn, every one answered.

Prints, for each, the summary requests the stand-in received, the bytes of their bodies, the
results they were for (distinct), what the stand-in billed for them, and what the report says
they cost (`totals.summaries.costUsd`).

    .venv/bin/python bench/summaries.py        # ~20 s
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.server import serve, standin_config  # noqa: E402
from tests.standin import StandIn, run_standin  # noqa: E402

SUMMARISER = "gpt-4o-mini"
OUTPUT = "".join(f"line {i}: " + "ok " * 40 + "\n" for i in range(128))  # ~16 KB


def _chat(turns: int, **extra: Any) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "fix the failing test"},
    ]
    for i in range(turns):
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": "exec", "arguments": '{"cmd": "pytest"}'}}  # fmt: skip
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": f"run {i}\n{OUTPUT}"},
        ]
    return {"model": "gpt-4o", "messages": messages, **extra}


def _summaries(standin: StandIn) -> list[bytes]:
    return [r.body for r in standin.received if r.body and r.json.get("model") == SUMMARISER]


def _scene(name: str, bodies: list[dict[str, Any]]) -> None:
    with tempfile.TemporaryDirectory() as tmp, run_standin() as standin:
        path = Path(tmp)
        config = standin_config(path, standin)
        config["agents"]["defaults"]["contextPruning"] = {
            "mode": "cache-ttl",
            "summarize": {"model": SUMMARISER, "minChars": 4000},
        }
        config["memory"]["inject"] = {"enabled": False}
        with serve(path, config) as server, httpx.Client(timeout=60) as client:
            statuses = []
            for body in bodies:
                r = client.post(f"{server.base_url}/chat/completions", json=body)
                statuses.append(r.status_code)
                time.sleep(0.05)  # an agent's own time between requests
            time.sleep(1.5)  # the summaries asked last, answered
            report = server.report()
        sent = _summaries(standin)
        results = {
            httpx.Response(200, content=b).json()["messages"][1]["content"][:8] for b in sent
        }
        billed = sum(line.usd or 0.0 for line in standin.bills if line.model == SUMMARISER)
        reported = (report["totals"].get("summaries") or {}).get("costUsd")
        print(
            f"{name}: {len(bodies)} requests ({', '.join(sorted(set(map(str, statuses))))}); "
            f"{len(sent)} summary requests, {sum(map(len, sent)) / 1024:,.0f} KB sent, "
            f"for {len(results)} results; billed ${billed:.6f}, the report says "
            + ("nothing" if reported is None else f"${reported:.6f}")
        )


def main() -> None:
    _scene("unknown model", [_chat(40, x_standin={"status": 404})] * 10)
    _scene("normal session", [_chat(turns) for turns in range(1, 31)])


if __name__ == "__main__":
    main()
