"""Crafted client text cannot break the report or cost another client theirs (issue 24, items
4, 5 and 12), on the real server, on SQLite and on PostgreSQL: a lone surrogate or a NUL in
the model or in `previous_response_id`, sent while another key's requests are written in the
same batches."""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.e2e.server import CTXBUDGET, base_config, serve
from tests.standin import StandIn

ALICE = {"authorization": "Bearer ka-1"}
MALLORY = {"authorization": "Bearer km-2"}
ADMIN = {"authorization": "Bearer adm-3"}
JSON = {"content-type": "application/json"}
HOSTILE = [  # raw bodies: JSON escapes that parse to a lone surrogate or a NUL
    (
        "/chat/completions",
        '{"model": "gpt\\ud800", "messages": [{"role": "user", "content": "a"}]}',
    ),
    (
        "/chat/completions",
        '{"model": "gpt\\u0000", "messages": [{"role": "user", "content": "b"}]}',
    ),
    ("/responses", '{"model": "gpt-4o", "input": "c", "previous_response_id": "r\\udfff\\u0000"}'),
]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_crafted_text_breaks_no_report_and_costs_no_one_their_records(
    tmp_path: Path, standin: StandIn, request: pytest.FixtureRequest, backend: str
) -> None:
    config = base_config(tmp_path, standin.base_url)
    config["proxy"]["upstream"]["apiKeyEnv"] = "OPENAI_API_KEY"
    if backend == "postgres":
        config["database"] = {"url": request.getfixturevalue("pg_url")}
    env = {
        "OPENAI_API_KEY": "sk-upstream",
        "CTXBUDGET_PROXY_KEYS": "alice=ka-1,mallory=km-2",
        "CTXBUDGET_ADMIN_KEY": "adm-3",
    }
    with serve(tmp_path, config, env=env) as server:

        def send(i: int) -> int:
            if i % 4 == 3:  # mallory's, interleaved with alice's: the same write batches
                path, raw = HOSTILE[(i // 4) % len(HOSTILE)]
                headers = {**MALLORY, **JSON}
            else:
                path = "/chat/completions"
                raw = json.dumps(
                    {"model": "gpt-4o", "messages": [{"role": "user", "content": "q"}]}
                )
                headers = {**ALICE, **JSON}
            reply = httpx.post(f"{server.base_url}{path}", content=raw, headers=headers, timeout=30)
            return reply.status_code

        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(send, range(28)))  # alice 21, mallory 7
        assert len(codes) == 28  # each answered (the stand-in fails on a surrogate model: 500)

        alices = httpx.get(f"{server.root}/context/budget", headers=ALICE, timeout=30)
        assert alices.status_code == 200
        assert alices.json()["totals"]["requests"] == 21, "alice's records are all there"
        assert alices.json()["lost"] == 0
        for who in (ALICE, MALLORY, ADMIN):
            for fmt in ("json", "text", "html"):
                reply = httpx.get(
                    f"{server.root}/context/budget", params={"format": fmt}, headers=who, timeout=30
                )
                assert reply.status_code == 200, (who, fmt, reply.text[:200])
        everyone = httpx.get(f"{server.root}/context/budget", headers=ADMIN, timeout=30).json()
        assert everyone["totals"]["requests"] == 28 and everyone["lost"] == 0
        models = {r["model"] for r in everyone["recent"]}
        assert {"gpt\ufffd", "gpt-4o"} <= models
        notes = [r["note"] for r in everyone["recent"] if r["note"]]
        assert any("r\ufffd\ufffd" in n for n in notes), "previous_response_id, made storable"

        command = {"model": "gpt-4o", "messages": [{"role": "user", "content": "/context budget"}]}
        reply = httpx.post(f"{server.base_url}/chat/completions", json=command, headers=MALLORY)
        assert reply.status_code == 200
        assert "Context budget" in reply.json()["choices"][0]["message"]["content"]
        for bad in ("%00", "cb-%00", "%ED%A0%80"):
            reply = httpx.get(f"{server.root}/context/budget/requests/{bad}", headers=ADMIN)
            assert reply.status_code == 404, (bad, reply.text)

        cli_env = {k: v for k, v in os.environ.items() if not k.startswith("CTXBUDGET")}
        for args in (["report"], ["report", "--json"]):
            cli = subprocess.run(
                [CTXBUDGET, *args, "--config", str(server.config_path)],
                capture_output=True,
                text=True,
                env={**cli_env, "HOME": str(tmp_path)},
                cwd=tmp_path,
            )
            assert cli.returncode == 0 and "Traceback" not in cli.stderr, cli.stderr[-2000:]
        assert json.loads(cli.stdout)["totals"]["requests"] == 28
    assert "Traceback" not in server.output()
