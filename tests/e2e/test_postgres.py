"""Several proxies, one PostgreSQL (issue 14): two real `ctxbudget serve` processes on two
ports share one database, and a database outage costs the report, never the traffic."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.server import ProxyServer, base_config, serve
from tests.openclaw import openclaw_request
from tests.pg import Cluster, postgres_cluster
from tests.standin import StandIn


def _config(tmp_path: Path, standin: StandIn, url: str) -> dict[str, Any]:
    config = base_config(tmp_path, standin.base_url)
    config["proxy"]["upstream"]["apiKeyEnv"] = None
    config["database"] = {"url": url, "connectTimeoutSeconds": 2}
    return config


@pytest.fixture
def two(tmp_path: Path, standin: StandIn, pg_url: str) -> Iterator[list[ProxyServer]]:
    """Two proxies, each with its own folder (no SQLite file in common), one database."""
    with ExitStack() as stack:
        servers = []
        for name in ("a", "b"):
            folder = tmp_path / name
            folder.mkdir()
            servers.append(stack.enter_context(serve(folder, _config(folder, standin, pg_url))))
        yield servers


def _chat(server: ProxyServer, session: str) -> httpx.Response:
    body = openclaw_request(stream=False, model="gpt-4o")
    headers = {"x-context-budget-session": session}
    return httpx.post(f"{server.base_url}/chat/completions", json=body, headers=headers, timeout=30)


def test_two_proxies_share_one_report(two: list[ProxyServer]) -> None:
    a, b = two
    with ThreadPoolExecutor(8) as pool:  # both at once, as behind a load balancer
        replies = list(pool.map(lambda i: _chat((a, b)[i % 2], f"s{i % 3}"), range(24)))
    assert [r.status_code for r in replies] == [200] * 24
    ids = {r.headers["x-context-budget-request-id"] for r in replies}
    for server in two:
        report = _settled(server, 24)
        assert report["totals"]["requests"] == 24
        assert {r["id"] for r in report["recent"]} == ids
        assert report["window"]["runs"] == 2, "both proxies' runs are in one report"
        assert sorted(s["id"] for s in report["sessions"]) == ["s0", "s1", "s2"]
        assert sum(s["requests"] for s in report["sessions"]) == 24
        # either proxy can show a request the other one served
        served = replies[0].headers["x-context-budget-request-id"]
        one = httpx.get(f"{server.root}/context/budget/requests/{served}")
        assert one.status_code == 200


def test_memories_are_shared_and_concurrent_adds_through_both_lose_nothing(
    two: list[ProxyServer], standin: StandIn
) -> None:
    a, b = two
    r = httpx.post(f"{a.base_url}/memories", json={"text": "The zebra deadline is Friday 28th"})
    assert r.status_code == 201, r.text
    # a memory added through one proxy is injected by the other
    ask = {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "when is the zebra deadline?"}],
    }
    answer = httpx.post(f"{b.base_url}/chat/completions", json=ask, timeout=30)
    assert answer.status_code == 200 and answer.headers["x-context-budget-memories"] == "1"
    assert "zebra deadline is Friday 28th" in str(standin.last_json["messages"])

    def add(i: int) -> int:
        server = (a, b)[i % 2]
        reply = httpx.post(f"{server.base_url}/memories", json={"text": f"note {i}"}, timeout=30)
        return reply.status_code

    with ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(add, range(60)))
    assert codes == [201] * 60
    for server in two:
        listed = httpx.get(f"{server.base_url}/memories", timeout=30).json()["data"]
        texts = {m["text"] for m in listed}
        assert {f"note {i}" for i in range(60)} <= texts, "every acknowledged add is there"


def test_a_database_outage_costs_the_report_not_the_traffic(
    tmp_path: Path, standin: StandIn
) -> None:
    with postgres_cluster() as cluster:  # a private cluster: this test stops it
        url = cluster.new_database()
        with serve(tmp_path, _config(tmp_path, standin, url)) as server:
            assert _chat(server, "before").status_code == 200
            assert server.report()["totals"]["requests"] == 1
            cluster.stop()
            during = [_chat(server, "during") for _ in range(3)]
            assert [r.status_code for r in during] == [200] * 3, "traffic goes on"
            report = httpx.get(f"{server.root}/context/budget", timeout=30)
            assert report.status_code == 503
            error = report.json()["error"]
            assert error["code"] == "database_unavailable"
            assert "database" in error["message"] and "proxied requests do not" in error["message"]
            _restart(cluster)
            assert _chat(server, "after").status_code == 200
            after = _settled(server, 5)
            # the requests of the outage were kept, and written once the database answered
            assert after["lost"] == 0
            assert after["totals"]["requests"] == 5
            assert {s["id"] for s in after["sessions"]} == {"before", "during", "after"}
        log = server.log_path.read_text()
        assert "report database unavailable" in log and "Traceback" not in log
        assert "report database answers again" in log


def _restart(cluster: Cluster) -> None:
    cluster.start()


def _settled(server: ProxyServer, requests: int) -> dict[str, Any]:
    """The report once every proxy's writer has written (each flushes only its own queue; a
    database that just started may take a retry)."""
    deadline = time.monotonic() + 15
    while True:
        reply = httpx.get(f"{server.root}/context/budget", timeout=30)
        if reply.status_code == 200:
            report: dict[str, Any] = reply.json()
            if report["totals"]["requests"] >= requests or time.monotonic() > deadline:
                return report
        elif time.monotonic() > deadline:
            reply.raise_for_status()
        time.sleep(0.1)
