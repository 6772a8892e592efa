"""The report: chat command, HTTP report, per-request detail, CLI, several workers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.server import CTXBUDGET, base_config, free_port, sdk, serve
from tests.openclaw import openclaw_request
from tests.standin import StandIn


def _openclaw_turn(text: str) -> dict[str, Any]:
    """A new user turn as OpenClaw 9.x sends it: system, stamped user text, internal context."""
    body = openclaw_request(version="9.x")
    messages = body["messages"]
    body["messages"] = [messages[0], messages[1], messages[-1]]
    body["messages"][1] = {
        "role": "user",
        "content": f"[Sun 2026-11-22 11:28 UTC] {text}\n\nRuntime: agent=main | host=vm",
    }
    return body


def test_chat_command_is_answered_by_the_proxy(tmp_path: Path, standin: StandIn) -> None:
    with serve(tmp_path, base_config(tmp_path, standin.base_url)) as server:
        client = sdk(base_url=server.base_url, api_key="sk-x")
        client.chat.completions.create(**openclaw_request(version="9.x", stream=False))
        assert len(standin.received) == 1

        body = _openclaw_turn("/context budget")
        text = "".join(
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(**body)  # OpenClaw always streams
            if c.choices
        )
        assert text.startswith("📉 ctxbudget ")
        assert "\nContext budget: ON" in text
        assert "Since " in text and ": 1 request, " in text
        assert "bootstrap files 8,000 per file" in text
        assert len(text.splitlines()) <= 25  # chat-sized: `full` has the rest

        body = _openclaw_turn("/context budget json")
        body["stream"] = False
        body.pop("stream_options", None)
        reply = client.chat.completions.create(**body)
        as_json = json.loads(reply.choices[0].message.content or "")
        assert as_json["totals"]["requests"] == 1
        assert as_json == {**server.report(), "generatedAt": as_json["generatedAt"]}
        assert len(standin.received) == 1, "the command must not reach the upstream"


def test_report_json_text_and_detail(tmp_path: Path, standin: StandIn) -> None:
    with serve(tmp_path, base_config(tmp_path, standin.base_url)) as server:
        client = sdk(base_url=server.base_url, api_key="sk-x")
        raw = client.chat.completions.with_raw_response.create(
            **openclaw_request(version="9.x", stream=False)
        )
        request_id = raw.headers["x-context-budget-request-id"]
        report = server.report()
        assert report["caps"]["bootstrap"]["value"] == 8000
        assert report["totals"]["requests"] == 1
        assert report["totals"]["savedChars"] == int(raw.headers["x-context-budget-saved-chars"])
        assert report["totals"]["savedTokens"] > 0
        recent = report["recent"][0]
        assert recent["id"] == request_id
        detail = httpx.get(f"{server.root}/context/budget/requests/{request_id}").json()
        assert detail["segments"] == recent["segments"]
        labels = [s["label"] for s in detail["segments"] if s["kind"] == "bootstrap"]
        assert any(label.endswith("/AGENTS.md") for label in labels)

        text = httpx.get(f"{server.root}/context/budget", params={"format": "text"})
        assert text.headers["content-type"].startswith("text/plain")
        assert request_id in text.text and "AGENTS.md" in text.text
        accept = httpx.get(f"{server.root}/context/budget", headers={"accept": "text/plain"})
        assert accept.text.startswith("📉 ctxbudget ")

        missing = httpx.get(f"{server.root}/context/budget/requests/cb-nope")
        assert missing.status_code == 404
        assert "no request 'cb-nope'" in missing.json()["error"]["message"]

    out = subprocess.run(
        [CTXBUDGET, "report", "--json", "--config", str(server.config_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    cli = json.loads(out.stdout)
    assert cli["totals"] == report["totals"]


def test_report_covers_every_worker(tmp_path: Path, standin: StandIn) -> None:
    with serve(tmp_path, base_config(tmp_path, standin.base_url), workers=2) as server:
        with httpx.Client() as http:
            for _ in range(30):
                r = http.post(
                    f"{server.base_url}/chat/completions",
                    json=openclaw_request(version="9.x", stream=False),
                    headers={"connection": "close"},  # new connection: spread over workers
                )
                assert r.status_code == 200
        # each worker writes its records in batches (<= 50 ms): allow for the other's last one
        deadline = time.monotonic() + 5
        report = server.report()
        while report["totals"]["requests"] < 30 and time.monotonic() < deadline:
            time.sleep(0.05)
            report = server.report()
        assert report["totals"]["requests"] == 30
        workers = {r["worker"] for r in report["recent"]}
        assert len(workers) == 2, "both workers should have served requests"


def test_tokens_saved_become_money_at_the_models_input_price(
    tmp_path: Path, standin: StandIn
) -> None:
    price = 2.5e-6  # gpt-4o's input price per token in litellm's model map
    with serve(tmp_path, base_config(tmp_path, standin.base_url)) as server:
        client = sdk(base_url=server.base_url, api_key="sk-x")
        priced = client.chat.completions.with_raw_response.create(
            **{**openclaw_request(version="9.x", stream=False), "model": "gpt-4o"}
        )
        unknown = client.chat.completions.with_raw_response.create(
            **{**openclaw_request(version="4.x", stream=False), "model": "my-local-llama"}
        )
        report = server.report()
        text = httpx.get(f"{server.base_url.removesuffix('/v1')}/context/budget?format=text").text
    tokens = int(priced.headers["x-context-budget-saved-tokens"])
    assert tokens > 1000
    assert priced.headers["x-context-budget-gross-saved-usd"] == f"{tokens * price:.6f}"
    assert "x-context-budget-gross-saved-usd" not in unknown.headers
    assert "x-context-budget-saved-usd" not in unknown.headers  # no price: no money
    assert int(unknown.headers["x-context-budget-saved-tokens"]) > 0

    second, first = report["recent"]
    assert first["model"] == "gpt-4o" and first["savedTokens"] == tokens
    assert first["inputPricePerMTok"] == 2.5
    assert first["savedUsd"] == pytest.approx(tokens * price)
    kinds = {s["kind"] for s in first["segments"] if s["action"] == "clamped"}
    assert sum(s["savedUsd"] for s in first["segments"]) == pytest.approx(first["savedUsd"])
    assert second["savedUsd"] is None and second["inputPricePerMTok"] is None
    totals = report["totals"]
    assert totals["unpricedRequests"] == 1
    assert totals["savedUsd"] == pytest.approx(first["savedUsd"])
    assert sum(totals["byKind"][k]["savedUsd"] for k in kinds) == pytest.approx(totals["savedUsd"])
    assert f"= ${totals['savedUsd']:,.6f} at the full input price" in text
    assert "1 request(s) for models without a price" in text


def test_the_saved_usd_header_is_the_requests_net_saving(tmp_path: Path, standin: StandIn) -> None:
    """`x-context-budget-saved-usd` is this request's cost without ctxbudget minus its cost
    (issue 23), the report's `netSavedUsd` to the cent: not the clamped tokens at the input
    price. A stream's headers leave before its usage: it has none, and says where to look."""
    config = base_config(tmp_path, standin.base_url)
    config["proxy"]["upstream"]["apiKeyEnv"] = None
    with serve(tmp_path, config) as server:
        httpx.post(f"{server.base_url}/memories", json={"text": "The user drinks green tea"})
        first = {**openclaw_request(version="9.x", stream=False), "model": "gpt-4o"}
        second = {**first, "messages": [*first["messages"], {"role": "user", "content": "tea?"}]}
        nets = []
        for body in (first, second, second):
            r = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=30)
            assert r.status_code == 200, r.text
            entry = httpx.get(server.root + r.headers["x-context-budget-report"]).json()
            net = entry["withoutCtxbudgetUsd"] - entry["costUsd"]
            assert entry["netSavedUsd"] == pytest.approx(net)
            assert r.headers["x-context-budget-saved-usd"] == f"{entry['netSavedUsd']:.6f}"
            gross = float(r.headers["x-context-budget-gross-saved-usd"])
            nets.append((net, gross))
        # the first request's clamps saved full-price input; later, the clamped blocks are
        # cache reads: the net saving is a fraction of the gross figure
        assert nets[0][0] > 0
        assert 0 < nets[2][0] < 0.75 * nets[2][1]

        off = httpx.post(
            f"{server.base_url}/chat/completions",
            json={**second, "messages": [*second["messages"], {"role": "user", "content": "hm"}]},
            headers={"x-context-budget": "off"},  # nothing clamped, a memory injected: a cost
            timeout=30,
        )
        entry = httpx.get(server.root + off.headers["x-context-budget-report"]).json()
        assert entry["memoryTokens"] > 0 and entry["netSavedUsd"] < 0
        assert off.headers["x-context-budget-saved-usd"] == f"{entry['netSavedUsd']:.6f}"
        assert off.headers["x-context-budget-saved-usd"].startswith("-")

        with httpx.stream(
            "POST", f"{server.base_url}/chat/completions", json={**second, "stream": True}
        ) as streamed:
            assert "x-context-budget-saved-usd" not in streamed.headers
            assert float(streamed.headers["x-context-budget-gross-saved-usd"]) > 0
            streamed.read()
        entry = httpx.get(server.root + streamed.headers["x-context-budget-report"]).json()
        assert entry["stream"] and entry["netSavedUsd"] is not None


def test_report_beside_a_running_serve_reports_what_the_server_does(
    tmp_path: Path, standin: StandIn
) -> None:
    """As scripts/serve runs it (issue 23): `serve` and `ctxbudget report` in the same
    directory find the same ./ctxbudget.jsonc — no --config, no $CTXBUDGET_CONFIG — and the
    report is the server's, recommendations and the page's address included."""
    here, home = tmp_path / "checkout", tmp_path / "home"
    here.mkdir()
    home.mkdir()
    port = free_port()
    config = base_config(tmp_path, standin.base_url)
    config["proxy"]["port"] = port
    (here / "ctxbudget.jsonc").write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXBUDGET")}
    env["HOME"] = str(home)
    with (tmp_path / "serve.log").open("wb") as log:
        process = subprocess.Popen(
            [CTXBUDGET, "serve"], cwd=here, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            root = f"http://127.0.0.1:{port}"
            for _ in range(600):
                try:
                    if httpx.get(f"{root}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.05)
            client = sdk(base_url=f"{root}/v1", api_key="sk-x")
            client.chat.completions.create(**{**openclaw_request(stream=False), "model": "gpt-4o"})
            served = httpx.get(f"{root}/context/budget", timeout=30).json()
            served_text = httpx.get(f"{root}/context/budget?format=text", timeout=30).text
        finally:
            process.terminate()
            process.wait(timeout=15)

    def report(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CTXBUDGET, "report", *flags], cwd=here, env=env, capture_output=True, text=True
        )

    as_json, as_text = report("--json"), report()
    assert as_json.returncode == 0, as_json.stderr
    assert as_json.stderr == f"ctxbudget: using config {here / 'ctxbudget.jsonc'}\n"
    cli = json.loads(as_json.stdout)
    assert served["totals"]["requests"] == 1
    assert served["page"] == f"http://127.0.0.1:{port}/context/budget"
    moments = ("generatedAt", "config")  # when each was made, and when each loaded the file
    # the command names the files it read (it may run elsewhere); the server's report does not
    data = {"report": str(tmp_path / "report.db"), "memories": str(tmp_path / "memory.db")}
    assert cli.pop("data") == data and "data" not in served
    assert {k: v for k, v in cli.items() if k not in moments} == {
        k: v for k, v in served.items() if k not in moments
    }
    assert cli["config"]["path"] == served["config"]["path"] == str(here / "ctxbudget.jsonc")
    loaded = re.compile(r"\(loaded [^)]*\)")
    said = f"Data: report {data['report']}, memories {data['memories']}\n"
    assert said in as_text.stdout
    assert loaded.sub("", as_text.stdout.replace(said, "")) == loaded.sub("", served_text)
