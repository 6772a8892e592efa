"""Several proxies, one PostgreSQL (issue 14): two real `ctxbudget serve` processes on two
ports share one database, and a database outage costs the report, never the traffic."""

from __future__ import annotations

import itertools
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


ASK = {"model": "gpt-4o", "messages": [{"role": "user", "content": "when is the zebra deadline?"}]}
SESSIONS = itertools.count()


def _ask(server: ProxyServer) -> tuple[float, httpx.Response]:
    """A new conversation's question (recall runs: nothing is placed again), and how long its
    answer took."""
    headers = {"x-context-budget-session": f"ask-{next(SESSIONS)}"}
    started = time.monotonic()
    reply = httpx.post(f"{server.base_url}/chat/completions", json=ASK, headers=headers, timeout=60)
    return time.monotonic() - started, reply


def _at_once(server: ProxyServer, n: int = 6) -> list[tuple[float, httpx.Response]]:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: _ask(server), range(n)))


def test_a_database_outage_costs_chat_requests_their_memories_not_a_wait(
    tmp_path: Path, standin: StandIn
) -> None:
    """While the database is down, chat requests go upstream without memories at once, saying
    why, until a background check sees it again (the first that find it down wait at most one
    connect timeout: a refused connection fails them at once). A proxy started during the
    outage does not queue requests behind a lock while it connects (issue 24, item 7: 6 at
    once finished at 2, 4, ... 12 s with a 2 s connect timeout)."""
    with postgres_cluster() as cluster:  # a private cluster: this test stops it
        url = cluster.new_database()
        config = _config(tmp_path, standin, url)
        config["database"]["connectTimeoutSeconds"] = 3
        with serve(tmp_path, config) as server:
            added = httpx.post(f"{server.base_url}/memories", json={"text": "Zebra is Friday"})
            assert added.status_code == 201
            assert _ask(server)[1].headers["x-context-budget-memories"] == "1"
            cluster.stop()
            first = _at_once(server)
            assert [r.status_code for _, r in first] == [200] * 6, "traffic goes on"
            assert max(t for t, _ in first) < 5, "at most one connect timeout (3 s)"
            then = _at_once(server)
            assert [r.status_code for _, r in then] == [200] * 6
            assert max(t for t, _ in then) < 1.5, "skipped at once (each waited 3 s before)"
            for _, reply in then:
                assert reply.headers["x-context-budget-memories"] == "0"
                assert reply.headers["x-context-budget-memories-skipped"] == "database-unavailable"
            late_dir = tmp_path / "late"
            late_dir.mkdir()
            with serve(late_dir, _config(late_dir, standin, url)) as late:  # 2 s timeout
                started = _at_once(late)
                assert [r.status_code for _, r in started] == [200] * 6
                assert max(t for t, _ in started) < 5, "not 2, 4, ... 12 s behind a lock"
                assert max(t for t, _ in _at_once(late)) < 1.5
            cluster.start()
            deadline = time.monotonic() + 15
            while _ask(server)[1].headers["x-context-budget-memories"] != "1":
                assert time.monotonic() < deadline, "recall did not resume"
                time.sleep(0.2)
            report = _settled(server, 14)
            assert report["lost"] == 0, "the outage's requests were kept and written"
            said = [r.get("memorySkipped") for r in report["recent"]]
            assert any(s and "memory database did not answer" in s for s in said)
            text = httpx.get(f"{server.root}/context/budget?format=text", timeout=30).text
            assert "memories: none, the memory database did not answer" in text
        log = server.output()
        assert "Traceback" not in log
        assert "memory database answers again" in log


def test_after_a_restart_memory_calls_chats_and_records_go_on(
    tmp_path: Path, standin: StandIn
) -> None:
    """After a PostgreSQL restart every pooled connection is stale: five memory calls in a row
    answered 503 and a record was lost (issue 24, item 6)."""
    with postgres_cluster() as cluster:  # a private cluster: this test restarts it
        with serve(tmp_path, _config(tmp_path, standin, cluster.new_database())) as server:
            added = httpx.post(f"{server.base_url}/memories", json={"text": "Zebra is Friday"})
            assert added.status_code == 201
            with ThreadPoolExecutor(8) as pool:  # several connections in the pool
                listed = list(
                    pool.map(lambda _: httpx.get(f"{server.base_url}/memories"), range(16))
                )
            assert {r.status_code for r in listed} == {200}
            asked = [_ask(server) for _ in range(3)]
            assert _settled(server, 3)["totals"]["requests"] == 3
            cluster.stop()
            cluster.start()
            calls = [httpx.get(f"{server.base_url}/memories", timeout=30) for _ in range(5)]
            assert [r.status_code for r in calls] == [200] * 5
            asked = [_ask(server) for _ in range(5)]
            assert [r.headers["x-context-budget-memories"] for _, r in asked] == ["1"] * 5
            report = _settled(server, 8)
            assert report["totals"]["requests"] == 8 and report["lost"] == 0
        assert "Traceback" not in server.output()


def _tool_results(standin: StandIn) -> dict[str, str]:
    """Call id → the tool result text the stand-in got in its last request (chat)."""
    sent = standin.received[-1].json
    return {m["tool_call_id"]: m["content"] for m in sent["messages"] if m.get("role") == "tool"}


def _pruned_ids(results: dict[str, str]) -> list[str]:
    return [i for i, text in results.items() if "tool result pruned" in text]


def test_a_database_outage_keeps_pruned_results_and_takes_no_new_prune(
    tmp_path: Path, standin: StandIn
) -> None:
    """Issue 35, item 1: with the database down, every request carrying a prunable result
    (4,000+ chars before the newest assistant turns: nearly every request of a long agent
    session) was a 503, because reading the conversation's decisions failed. Now the
    decisions this process holds are applied (the same bytes as before the outage), no new
    prune is taken, and the answer's header and the report say so."""
    from tests.proxy.pipeline.test_prune import _chat as chat_body

    with postgres_cluster() as cluster:  # a private cluster: this test stops it
        config = _config(tmp_path, standin, cluster.new_database())
        config["agents"]["defaults"]["contextPruning"] = {"ttl": "1s"}
        config["memory"]["inject"] = {"enabled": False}
        with serve(tmp_path, config) as server:

            def send(turns: int) -> httpx.Response:
                return httpx.post(
                    f"{server.base_url}/chat/completions", json=chat_body(turns), timeout=30
                )

            assert send(5).status_code == 200
            time.sleep(1.5)  # the cache's lifetime passes: the next request prunes
            assert send(6).status_code == 200
            first = _tool_results(standin)
            assert _pruned_ids(first) == ["call_0", "call_1", "call_2"]
            before = {i: first[i] for i in _pruned_ids(first)}
            cluster.stop()
            time.sleep(1.2)  # past what a worker trusts of a read without asking again
            during = [send(7), send(8)]
            assert [r.status_code for r in during] == [200, 200], during[0].text
            for reply in during:
                assert reply.headers["x-context-budget-pruning-skipped"] == "database-unavailable"
            later = _tool_results(standin)
            assert {i: later[i] for i in before} == before, "the decisions held stand"
            time.sleep(1.5)  # cold again: call_3 and call_4 would be pruned now
            cold = send(9)
            assert cold.status_code == 200
            assert _pruned_ids(_tool_results(standin)) == ["call_0", "call_1", "call_2"]
            cluster.start()
            report = _settled(server, 5)
            assert report["lost"] == 0
            skipped = [r.get("pruneSkipped") for r in report["recent"]]
            assert sum(bool(s) for s in skipped) == 3
            assert all("database did not answer" in s for s in skipped if s)
            text = httpx.get(f"{server.root}/context/budget?format=text", timeout=30).text
            assert "pruning: the database did not answer" in text
            deadline = time.monotonic() + 10  # the breaker's check runs every second
            while "pruning's database answers again" not in server.output():
                assert time.monotonic() < deadline, "the breaker did not close"
                time.sleep(0.2)
            assert send(10).headers.get("x-context-budget-pruning-skipped") is None
        assert "Traceback" not in server.output()
