"""What ctxbudget saves in money, net of prompt-cache effects, on the captured OpenClaw sessions.

Every captured session in ../shared/fixtures (chat completions, Anthropic Messages, OpenAI
Responses) is replayed twice to the stand-in upstream, which bills as a provider does
(o200k_base tokens per block, prompt caching imitated; `tests/standin.py`):

- through the real proxy (`ctxbudget serve`) with the caps at their defaults: what the user
  pays with ctxbudget, and the report's own estimate of what they would have paid without;
- straight to the stand-in with its cache emptied: what they pay without ctxbudget.

It prints, per session and in total: prompt tokens, cost with and without ctxbudget at
litellm's prices (cache reads and writes at their own prices), the net saving, the report's
estimate next to the replayed truth, the naive saving (tokens removed at the full input
price, what a proxy that ignores caching would claim), and cache busts; then what each surface
shows first: the text report's first money line, the page's first money card, the sum of the
`x-context-budget-saved-usd` headers and the `ctxbudget_money_saved_usd_total` metric.

    .venv/bin/python bench/savings.py
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.openclaw import captured_sessions  # noqa: E402
from tests.standin import billed_as_reported, run_standin  # noqa: E402

MODELS = {  # route → a model litellm prices, cache reads and writes included
    "/v1/chat/completions": "gpt-4o",
    "/v1/messages": "claude-sonnet-4-5",
    "/v1/responses": "gpt-4o",
}
HEADERS = {"x-api-key": "sk-bench", "authorization": "Bearer sk-bench"}
CLASSES = ("input", "cacheRead", "cacheWrite", "output")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prices(model: str) -> dict[str, float]:
    from ctxbudget.proxy.report.prices import prices

    p = prices(model)
    assert p is not None, model
    return {
        "input": p.input,
        "cacheRead": p.cache_read,
        "cacheWrite": p.cache_write,
        "output": p.output,
    }


def _usd(usages: list[dict[str, int]], model: str) -> float:
    p = _prices(model)
    return sum(u[k] * p[k] for u in usages for k in CLASSES)


def main() -> None:
    sessions = captured_sessions(MODELS)
    if not sessions:
        sys.exit("no captured sessions: ../shared/fixtures is absent")
    with run_standin(record=False) as standin, tempfile.TemporaryDirectory() as tmp:
        port = _free_port()
        config = {
            "proxy": {
                "upstream": {"baseUrl": standin.base_url, "apiKeyEnv": None},
                "anthropic": {"baseUrl": standin.root, "apiKeyEnv": None},
            },
            "agents": {"defaults": {"contextBudget": {"enabled": True}}},
            "report": {"path": f"{tmp}/report.db"},
            "memory": {"store": {"path": f"{tmp}/memory.db"}},
        }
        Path(tmp, "config.json").write_text(json.dumps(config))
        env = {k: v for k, v in os.environ.items() if not k.startswith("CTXBUDGET")}
        proxy = subprocess.Popen(
            [str(Path(sys.executable).parent / "ctxbudget"), "serve", "--config",
             f"{tmp}/config.json", "--port", str(port)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(200):
                try:
                    if httpx.get(f"{base}/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.05)
            with_proxy, busts, header_usd = {}, {}, 0.0
            for folder, route, _, bodies in sessions:
                standin.billed.clear()
                headers = {**HEADERS, "x-context-budget-session": f"bench-{folder}"}
                replies = [
                    httpx.post(base + route, json={**b, "stream": False}, headers=headers,
                               timeout=60)
                    for b in bodies
                ]  # fmt: skip
                assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
                busts[folder] = [r.headers.get("x-context-budget-cache-bust") for r in replies]
                header_usd += sum(
                    float(r.headers.get("x-context-budget-saved-usd", 0)) for r in replies
                )
                with_proxy[folder] = [billed_as_reported(u, route) for u in standin.billed]
            report = httpx.get(f"{base}/context/budget", timeout=30).json()
            text = httpx.get(f"{base}/context/budget?format=text", timeout=30).text
            page = httpx.get(f"{base}/context/budget?format=html", timeout=30).text
            metrics = httpx.get(f"{base}/metrics", timeout=30).text
        finally:
            proxy.terminate()
            proxy.wait(timeout=15)
        standin.reset()
        without = {}
        for folder, route, _, bodies in sessions:
            standin.billed.clear()
            for b in bodies:
                r = httpx.post(standin.root + route, json={**b, "stream": False}, headers=HEADERS)
                assert r.status_code == 200, r.text
            without[folder] = [billed_as_reported(u, route) for u in standin.billed]

    by_id = {s["id"]: s for s in report["sessions"]}
    rows, totals = [], {"with": 0.0, "without": 0.0, "estimate": 0.0, "naive": 0.0}
    for folder, _, model, bodies in sessions:
        s = by_id[f"bench-{folder}"]
        cost, truth = _usd(with_proxy[folder], model), _usd(without[folder], model)
        naive = s["savedTokens"] * _prices(model)["input"]
        prompt_with = sum(u[k] for u in with_proxy[folder] for k in CLASSES[:3])
        prompt_without = sum(u[k] for u in without[folder] for k in CLASSES[:3])
        rows.append(
            (folder, model, len(bodies), prompt_without, prompt_with, truth, cost,
             s["withoutCtxbudgetUsd"], naive, s["cacheBusts"]["ctxbudget"],
             sum(b is not None for b in busts[folder]))
        )  # fmt: skip
        totals["with"] += cost
        totals["without"] += truth
        totals["estimate"] += s["withoutCtxbudgetUsd"]
        totals["naive"] += naive

    print("session            model              reqs  prompt tokens        cost without → with"
          "        net saved  report's estimate  naive claim  busts")  # fmt: skip
    for folder, model, n, pw, pc, truth, cost, est, naive, b, hb in rows:
        saved = truth - cost
        print(
            f"{folder:18} {model:18} {n:4}  {pw:8,} → {pc:8,} ({(pc - pw) / pw:+.1%})  "
            f"${truth:.4f} → ${cost:.4f}  ${saved:.4f} ({saved / truth:.1%})  "
            f"${est:.4f} ({est - truth:+.5f})  ${naive:.4f}      {b}/{hb}"
        )
    saved = totals["without"] - totals["with"]
    first_line = next(line for line in text.splitlines() if "$" in line)
    card = re.search(
        r"<div class='k'>([^<]*)</div><div class='v'>(?:<[^>]*>)*([^<]*\$[^<]*)<", page
    )
    metric = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("ctxbudget_money_saved_usd_total")
    )
    print("what each surface shows first:")
    print(f"  text report's first money line: {first_line.strip()}")
    print(f"  page's first money card: {card.group(1) + ': ' + card.group(2) if card else '-'}")
    print(f"  x-context-budget-saved-usd headers, summed: ${header_usd:.4f}")
    print(f"  ctxbudget_money_saved_usd_total: ${metric:.4f}")
    print(
        f"total: ${totals['without']:.4f} → ${totals['with']:.4f}, saved ${saved:.4f} net of "
        f"cache effects ({saved / totals['without']:.1%}); the report estimated "
        f"${totals['estimate'] - totals['with']:.4f}; a cache-blind count of the removed tokens "
        f"at full input price would claim ${totals['naive']:.4f}"
    )


if __name__ == "__main__":
    main()
