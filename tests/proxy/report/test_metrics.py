"""`GET /metrics`: Prometheus counters and histograms of proxied requests, in-process, read
with prometheus_client's own text parser and checked against the report's figures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ctxbudget.memory import NewMemory, SQLiteMemoryStore
from ctxbudget.proxy.errors import UpstreamError
from ctxbudget.proxy.report.metrics import MULTIPROCESS_ENV, Metrics, shared_between_workers
from tests.fakes import chat_chunks
from tests.inproc import InProcess, config_for, proxy_app, state_of
from tests.openclaw import openclaw_request, web_fetch_result

MEMORY = "Therapy is on Thursdays at 3pm"
SECRET_URL = "https://intranet.example/doc?token=alice-secret-123"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(client: InProcess, headers: dict[str, str] | None = None) -> Samples:
    """Every sample of /metrics: (name, sorted labels) → value."""
    state_of(client).reports.flush()  # the sinks run on the report's writer thread
    r = client.get("/metrics", headers=headers or {})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return _samples(r.text)


def _samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _kind(kind: str, action: str = "clamped") -> tuple[tuple[str, str], ...]:
    return (("action", action), ("kind", kind))


def test_counters_move_with_proxied_requests_and_match_the_report(tmp_path: Path) -> None:
    SQLiteMemoryStore(tmp_path / "memory.db").add(NewMemory(owner="default", text=MEMORY))
    with proxy_app(tmp_path) as (client, fake):
        before = _scrape(client)
        assert before[("ctxbudget_chars_saved_total", _kind("bootstrap"))] == 0
        assert not any(name == "ctxbudget_requests_total" for name, _ in before)

        body = openclaw_request(stream=False, model="gpt-4o")
        body["messages"].append({"role": "user", "content": "when is therapy?"})
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        fake.answer_sse(chat_chunks("hi there", usage=True))
        body["stream"] = True
        assert client.post("/v1/chat/completions", json=body).status_code == 200

        got = _scrape(client)
        report = client.get("/context/budget").json()
    labels = (("format", "chat"), ("model", "gpt-4o"), ("status_class", "2xx"))
    assert got[("ctxbudget_requests_total", labels)] == 2 == report["totals"]["requests"]
    by_kind = report["totals"]["byKind"]
    for kind in ("bootstrap", "memory", "web_fetch"):
        assert got[("ctxbudget_segments_clamped_total", _kind(kind))] == by_kind[kind]["clamped"]
        assert got[("ctxbudget_chars_saved_total", _kind(kind))] == by_kind[kind]["savedChars"]
        assert got[("ctxbudget_tokens_saved_total", _kind(kind))] == by_kind[kind]["savedTokens"]
        assert got[("ctxbudget_money_gross_saved_usd_total", _kind(kind))] == pytest.approx(
            by_kind[kind]["savedUsd"]
        )
        assert got[("ctxbudget_chars_saved_total", _kind(kind, "would-clamp"))] == 0
    assert got[("ctxbudget_chars_saved_total", _kind("bootstrap"))] > 20_000
    # the money metric is the net saving, the report's first figure (issue 23)
    net = got[("ctxbudget_money_saved_usd_total", (("model", "gpt-4o"),))]
    assert net == pytest.approx(report["totals"]["money"]["savedUsd"])
    assert net == pytest.approx(sum(r["netSavedUsd"] for r in report["recent"]))
    assert got[("ctxbudget_added_latency_seconds_count", ())] == 2
    assert 0 < got[("ctxbudget_added_latency_seconds_sum", ())] < 10
    # the second request resends the first one's turn: its memory is placed again, and
    # recall ran once
    assert report["recent"][0]["memory"] is None and report["recent"][0]["memoriesReused"] == 1
    profile = report["recent"][1]["memory"]["applied"]
    assert got[("ctxbudget_recall_duration_seconds_count", (("profile", profile),))] == 1
    # the provider's tokens, by class, as the report has them
    for key, name in (("input", "input"), ("cacheRead", "cache_read"), ("output", "output")):
        labels = (("class", name), ("model", "gpt-4o"))
        billed = sum(r["usage"][key] for r in report["recent"] if r["usage"])
        assert got[("ctxbudget_provider_tokens_total", labels)] == billed


def test_with_the_budget_off_the_savings_are_would_clamp(tmp_path: Path) -> None:
    config = config_for(tmp_path, agents={"defaults": {"contextBudget": {"enabled": False}}})
    with proxy_app(tmp_path, config) as (client, _):
        client.post("/v1/chat/completions", json=openclaw_request(stream=False))
        got = _scrape(client)
        totals = client.get("/context/budget").json()["totals"]
    would = got[("ctxbudget_chars_saved_total", _kind("web_fetch", "would-clamp"))]
    assert would == totals["byKind"]["web_fetch"]["wouldSaveChars"] > 0
    assert got[("ctxbudget_chars_saved_total", _kind("web_fetch"))] == 0


def test_formats_and_status_classes_are_labels(tmp_path: Path) -> None:
    with proxy_app(tmp_path) as (client, fake):
        fake.fail(UpstreamError("overloaded", status=529))
        messages = {
            "model": "claude-x",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}],
        }
        assert client.post("/v1/messages", json=messages).status_code == 529
        fake.fail(UpstreamError("slow down", status=429))
        assert (
            client.post("/v1/responses", json={"model": "gpt-5", "input": "hi"}).status_code == 429
        )
        got = _scrape(client)
    requests = {
        labels: v for (name, labels), v in got.items() if name == "ctxbudget_requests_total"
    }
    assert requests == {
        (("format", "messages"), ("model", "claude-x"), ("status_class", "5xx")): 1,
        (("format", "responses"), ("model", "gpt-5"), ("status_class", "4xx")): 1,
    }


def test_labels_are_bounded_and_carry_no_secret_url_or_text(tmp_path: Path) -> None:
    body = openclaw_request(stream=False)
    body["messages"][3]["content"] = web_fetch_result(url=SECRET_URL, content="x " * 9000)
    odd = [SECRET_URL, "gpt 4o; drop", "x" * 101, "a//b"]
    with proxy_app(tmp_path) as (client, _):
        for model in ["m-1", "m-2", *odd]:
            client.post(
                "/v1/chat/completions",
                json={**body, "model": model},
                headers={"authorization": "Bearer sk-client-secret-123"},
            )
        state_of(client).reports.flush()
        text = client.get("/metrics").text
    models = {
        dict(labels)["model"]: v
        for (name, labels), v in _samples(text).items()
        if name == "ctxbudget_requests_total"
    }
    assert models == {"m-1": 1, "m-2": 1, "other": len(odd)}
    for secret in ("sk-client-secret-123", "intranet", "alice-secret", "Project Context", "x x"):
        assert secret not in text


def test_past_max_models_the_rest_are_other() -> None:
    metrics = Metrics(max_models=2)
    assert [metrics._model(m) for m in ("a", "b", "c", "a", None)] == [
        "a",
        "b",
        "other",
        "a",
        "unknown",
    ]


def test_openmetrics_when_the_scraper_asks(tmp_path: Path) -> None:
    with proxy_app(tmp_path) as (client, _):
        r = client.get("/metrics", headers={"accept": "application/openmetrics-text"})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    assert r.text.endswith("# EOF\n")


KEYS = {"CTXBUDGET_PROXY_KEYS": "alice=ka-1", "CTXBUDGET_ADMIN_KEY": "adm-1"}


@pytest.mark.parametrize(
    ("env", "headers", "status"),
    [
        ({}, {}, 200),  # open access (no keys): open, like the report
        (KEYS, {}, 401),
        (KEYS, {"authorization": "Bearer nope"}, 401),
        (KEYS, {"authorization": "Bearer ka-1"}, 403),  # a proxy key: sees every owner's
        (KEYS, {"x-api-key": "ka-1"}, 403),
        (KEYS, {"authorization": "Bearer adm-1"}, 200),
        (KEYS, {"x-api-key": "adm-1"}, 401),  # the admin and metrics keys: Bearer only
        ({"CTXBUDGET_METRICS_KEY": "mk-1"}, {"x-api-key": "mk-1"}, 401),
        ({**KEYS, "CTXBUDGET_METRICS_KEY": "mk-1"}, {"authorization": "Bearer mk-1"}, 200),
        ({"CTXBUDGET_METRICS_KEY": "mk-1"}, {}, 401),  # a metrics key alone closes it too
        ({"CTXBUDGET_METRICS_KEY": "mk-1"}, {"authorization": "Bearer mk-1"}, 200),
    ],
)
def test_who_may_read_metrics(
    tmp_path: Path, env: dict[str, str], headers: dict[str, str], status: int
) -> None:
    with proxy_app(tmp_path, env=env) as (client, _):
        r = client.get("/metrics", headers=headers)
    assert r.status_code == status, r.text
    if status == 403:
        assert r.json()["error"]["message"] == (
            "a proxy key may not read /metrics: it counts every key's requests. Scrape with "
            "the key in $CTXBUDGET_METRICS_KEY (proxy.metricsKeyEnv) or the admin key"
        )


def test_with_proxy_keys_and_no_reader_key_the_401_says_what_to_set(tmp_path: Path) -> None:
    with proxy_app(tmp_path, env={"CTXBUDGET_PROXY_KEYS": "ka-1"}) as (client, _):
        r = client.get("/metrics", headers={"authorization": "Bearer ka-1"})
        assert r.status_code == 403
        r = client.get("/metrics")
    assert r.status_code == 401
    assert r.json()["error"]["message"] == (
        "/metrics needs 'Authorization: Bearer <key>' with the key in $CTXBUDGET_METRICS_KEY "
        "(proxy.metricsKeyEnv) or the admin key ($CTXBUDGET_ADMIN_KEY); neither is set, so "
        "nobody may: put a key in $CTXBUDGET_METRICS_KEY"
    )


def test_one_worker_shares_nothing_and_drops_an_inherited_directory() -> None:
    env = {MULTIPROCESS_ENV: "/somewhere/old"}
    with shared_between_workers(1, env) as path:
        assert path is None
        assert env == {}


def test_several_workers_share_a_fresh_directory_removed_after() -> None:
    env: dict[str, str] = {}
    with shared_between_workers(3, env) as path:
        assert path is not None
        assert env[MULTIPROCESS_ENV] == path
        assert os.listdir(path) == []
    assert env == {}
    assert not os.path.exists(path)


_WORKER = """
import sys
from ctxbudget.proxy.report.metrics import Metrics
from ctxbudget.caps import Segment
from ctxbudget.proxy.report.record import RequestRecord, tally_of
from ctxbudget.proxy.tokens import TokenCounter
m = Metrics()
segs = (Segment(kind="web_fetch", label="u", before=200, after=100, action="clamped", cap=100),)
for i in range(int(sys.argv[1])):
    r = RequestRecord(id=str(i), ts=0, model="gpt-4o", enabled=True, stream=False, status=200,
                      duration_ms=1, segments=segs, segment_tokens=(25,), encoding="o200k_base",
                      input_price=0.02, marks={"start": 0, "upstream_start": 2_000_000})
    r = RequestRecord(**{**r.__dict__, "tally": tally_of(r, TokenCounter())})
    m.record(r, {"costUsd": 1.0, "withoutCtxbudgetUsd": 0.75, "netSavedUsd": -0.25})
m.batch_done()
if len(sys.argv) > 2:
    sys.stdout.write(m.render("")[0].decode())
"""


@pytest.mark.e2e  # three interpreters of its own, as `serve --workers`
def test_workers_add_up_in_multiprocess_mode(tmp_path: Path) -> None:
    """What `serve --workers N` sets up: each process writes its own values; any one's scrape
    shows the sum (prometheus_client fixes the mode at import, hence the subprocesses)."""
    env = {**os.environ, MULTIPROCESS_ENV: str(tmp_path)}
    for n in (3, 4):
        subprocess.run([sys.executable, "-c", _WORKER, str(n)], env=env, check=True, timeout=60)
    out = subprocess.run(
        [sys.executable, "-c", _WORKER, "1", "render"],
        env=env,
        check=True,
        timeout=60,
        capture_output=True,
        text=True,
    ).stdout
    got = _samples(out)
    labels = (("format", "chat"), ("model", "gpt-4o"), ("status_class", "2xx"))
    assert got[("ctxbudget_requests_total", labels)] == 8
    assert got[("ctxbudget_chars_saved_total", _kind("web_fetch"))] == 800
    assert got[("ctxbudget_money_gross_saved_usd_total", _kind("web_fetch"))] == 4.0
    # net of cache effects, and it may fall: every worker's, those that ended too
    assert got[("ctxbudget_money_saved_usd_total", (("model", "gpt-4o"),))] == -2.0
    assert got[("ctxbudget_added_latency_seconds_count", ())] == 8
    assert got[("ctxbudget_added_latency_seconds_bucket", (("le", "0.002"),))] == 8
