"""Money a user can bill (issue 11): the report's per-session usage, cost, cost without
ctxbudget and cache busts, checked against an independent recomputation.

The real OpenClaw sessions captured in `../shared/fixtures` are replayed twice to the stand-in,
which bills as a provider does (o200k_base tokens per block, prompt caching imitated over the
blocks, usage in each format's own fields):

- through the real proxy, caps at their defaults and a memory that recall injects: what the
  user pays with ctxbudget. The report must say exactly what the stand-in billed, priced here
  from the prices written below (litellm's map, read by hand);
- straight to a fresh stand-in, unchanged: what the user would have paid without ctxbudget.
  The report's estimate of that must be right to the cent, and ctxbudget must have caused no
  cache bust.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.server import ProxyServer, serve, standin_config
from tests.openclaw import captured_sessions
from tests.standin import StandIn, billed_as_reported

# USD per token (litellm's model_prices_and_context_window_backup.json, 1.106.2)
# (cacheWrite: a 5-minute write; cacheWrite1h: a 1-hour one, Anthropic's `ttl: "1h"`)
PRICES = {
    "gpt-4o": {"input": 2.5e-6, "cacheRead": 1.25e-6, "cacheWrite": 2.5e-6, "output": 10e-6},
    "gpt-4.1": {"input": 2e-6, "cacheRead": 0.5e-6, "cacheWrite": 2e-6, "output": 8e-6},
    "claude-sonnet-4-5": {
        "input": 3e-6,
        "cacheRead": 0.3e-6,
        "cacheWrite": 3.75e-6,
        "cacheWrite1h": 6e-6,
        "output": 15e-6,
    },
}
MODELS = {  # route → a model litellm prices, cache reads and writes included
    "/v1/chat/completions": "gpt-4o",
    "/v1/messages": "claude-sonnet-4-5",
    "/v1/responses": "gpt-4.1",
}
MEMORY = "The zebra project ships on Friday the 28th, after the design review"


def _sessions() -> list[tuple[str, str, str, list[dict[str, Any]]]]:
    return captured_sessions(MODELS)


@pytest.fixture
def server(tmp_path: Path, standin: StandIn) -> Iterator[ProxyServer]:
    with serve(tmp_path, standin_config(tmp_path, standin)) as running:
        r = httpx.post(f"{running.base_url}/memories", json={"text": MEMORY})
        assert r.status_code == 201, r.text
        yield running


HEADERS = {"x-api-key": "sk-test", "authorization": "Bearer sk-test"}


def _post(base: str, route: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    r = httpx.post(base + route, json=body, headers={**HEADERS, **headers}, timeout=60)
    assert r.status_code == 200, r.text
    return r


def _usd(usage: dict[str, int], model: str) -> float:
    """What the provider bills for `usage` (`billed_as_reported`): `cacheWrite` counts the
    1-hour writes too, which cost `cacheWrite1h` instead."""
    p = PRICES[model]
    long = usage.get("cacheWrite1h", 0)
    short = usage["cacheWrite"] - long
    return (
        usage["input"] * p["input"]
        + usage["cacheRead"] * p["cacheRead"]
        + short * p["cacheWrite"]
        + (long * p["cacheWrite1h"] if long else 0.0)
        + usage["output"] * p["output"]
    )


def _sum(usages: list[dict[str, int]]) -> dict[str, int]:
    return {k: sum(u[k] for u in usages) for k in ("input", "cacheRead", "cacheWrite", "output")}


@pytest.mark.skipif(not _sessions(), reason="../shared/fixtures (captured sessions) is absent")
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_the_report_bills_each_real_session_to_the_cent(
    server: ProxyServer, standin: StandIn, stream: bool
) -> None:
    with_proxy: dict[str, list[dict[str, int]]] = {}
    for folder, route, _, bodies in _sessions():
        standin.billed.clear()
        for body in bodies:
            r = _post(server.base_url.removesuffix("/v1"), route, {**body, "stream": stream})
            assert "x-context-budget-cache-bust" not in r.headers, r.headers
        with_proxy[folder] = [billed_as_reported(u, route) for u in standin.billed]
    report = server.report()

    # the same sessions, unchanged, straight to a stand-in with nothing cached
    standin.reset()
    without: dict[str, list[dict[str, int]]] = {}
    for folder, route, _, bodies in _sessions():
        standin.billed.clear()
        for body in bodies:
            _post(standin.root, route, {**body, "stream": stream})
        without[folder] = [billed_as_reported(u, route) for u in standin.billed]

    sessions = {s["model"]: s for s in report["sessions"]}
    assert len(report["sessions"]) == len(with_proxy)
    for folder, route, model, bodies in _sessions():
        got = sessions[model]
        assert got["format"] == {"/v1/chat/completions": "chat"}.get(route, route[4:])
        assert got["requests"] == len(bodies)
        # token for token: what the provider billed
        assert got["usage"] == _sum(with_proxy[folder])
        # to the cent (and closer): that usage at the model's prices
        cost = sum(_usd(u, model) for u in with_proxy[folder])
        assert got["costUsd"] == pytest.approx(cost, abs=1e-9)
        # what it would have cost unchanged: estimated from the clamps, right to the cent
        would = sum(_usd(u, model) for u in without[folder])
        assert abs(got["withoutCtxbudgetUsd"] - would) < 0.005, (got, would)
        assert got["savedUsd"] == pytest.approx(got["withoutCtxbudgetUsd"] - got["costUsd"])
        assert got["savedUsd"] > 0, "the default caps save money on these sessions"
        assert got["cacheBusts"]["ctxbudget"] == 0
        assert got["memoryTokens"] > 0, "the memory was injected, and is a cost"
    money = report["totals"]["money"]
    assert money["sessions"] == len(with_proxy)
    assert money["costUsd"] == pytest.approx(sum(s["costUsd"] for s in report["sessions"]))
    assert money["cacheBusts"] == {"client": 0, "ctxbudget": 0, "planned": 0}


def _one_hour(value: Any) -> Any:
    """`value` with every `cache_control` asking for a 1-hour cache, as OpenClaw sends it with
    `agents.defaults.params.cacheRetention: "long"`."""
    if isinstance(value, dict):
        return {
            k: {"type": "ephemeral", "ttl": "1h"} if k == "cache_control" else _one_hour(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_one_hour(v) for v in value]
    return value


@pytest.mark.skipif(not _sessions(), reason="../shared/fixtures (captured sessions) is absent")
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_one_hour_cache_writes_are_billed_at_twice_the_input_price(
    server: ProxyServer, standin: StandIn, stream: bool
) -> None:
    route, model = "/v1/messages", MODELS["/v1/messages"]
    (bodies,) = [b for _, r, _, b in _sessions() if r == route]
    for body in bodies:
        _post(server.base_url.removesuffix("/v1"), route, {**_one_hour(body), "stream": stream})
    billed = [billed_as_reported(u, route) for u in standin.billed]
    assert all(u["cacheWrite1h"] == u["cacheWrite"] for u in billed)
    assert sum(u["cacheWrite1h"] for u in billed) > 10_000
    (session,) = server.report()["sessions"]
    assert session["usage"] == _sum(billed)
    # every write at $6/MTok, not at the 5-minute $3.75: the provider's bill to the token
    assert session["costUsd"] == pytest.approx(sum(_usd(u, model) for u in billed), abs=1e-9)
