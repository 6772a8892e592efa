"""The config file is watched: edits apply on the next request; broken edits keep the last good."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx

from tests.e2e.server import CTXBUDGET, base_config, serve
from tests.openclaw import openclaw_request
from tests.standin import StandIn


def _post(server_url: str) -> httpx.Response:
    return httpx.post(
        f"{server_url}/chat/completions", json=openclaw_request(version="9.x", stream=False)
    )


def test_edits_apply_without_restart_and_broken_edits_keep_last_good(
    tmp_path: Path, standin: StandIn
) -> None:
    config = base_config(tmp_path, standin.base_url)
    with serve(tmp_path, config) as server:
        assert _post(server.base_url).headers["x-context-budget-enabled"] == "true"

        config["agents"]["defaults"]["contextBudget"]["enabled"] = False
        server.write_config(config)
        assert _post(server.base_url).headers["x-context-budget-enabled"] == "false"

        # a broken edit: the last good config (enabled: false) stays, the error is reported
        server.config_path.write_text('{"agents": {"defaults": {"contextBudget": {"enabled": ')
        os.utime(server.config_path, ns=(1, 1))  # a distinct mtime even on coarse clocks
        r = _post(server.base_url)
        assert r.status_code == 200
        assert r.headers["x-context-budget-enabled"] == "false"
        report = server.report()
        assert report["config"]["error"] and "ctxbudget.jsonc" in report["config"]["error"]
        text = httpx.get(f"{server.root}/context/budget?format=text").text
        assert "Config error, last good config still in force" in text
        assert "ctxbudget.jsonc" in server.output()

        config["agents"]["defaults"]["contextBudget"]["enabled"] = True
        server.write_config(config)
        assert _post(server.base_url).headers["x-context-budget-enabled"] == "true"
        assert server.report()["config"]["error"] is None


def test_broken_config_refuses_to_start(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonc"
    path.write_text(json.dumps({"agents": {"defaults": {"contextBudget": {"webFetchMaxChar": 1}}}}))
    out = subprocess.run(
        [CTXBUDGET, "serve", "--config", str(path)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 2
    assert "agents.defaults.contextBudget.webFetchMaxChar" in out.stderr
    assert "Traceback" not in out.stderr


def test_serve_says_the_port_is_in_use_before_starting(tmp_path: Path) -> None:
    import socket
    import subprocess

    from tests.e2e.server import CTXBUDGET

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [CTXBUDGET, "serve", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            # no config: the built-in defaults' stores are under $HOME, which is not ours
            env={**os.environ, "HOME": str(tmp_path)},
        )
    assert done.returncode == 1
    assert f"ctxbudget: port {port} on 127.0.0.1 is in use: pass --port or set proxy.port" in (
        done.stderr
    )
    assert "Application startup complete" not in done.stderr


def test_serve_says_when_the_port_is_held_by_ctxbudget_already_running(tmp_path: Path) -> None:
    """Issue 23: a second `serve` (or `scripts/serve` run twice) said only "in use"."""
    import subprocess

    from tests.e2e.server import CTXBUDGET, base_config, serve

    with serve(tmp_path, base_config(tmp_path, "http://127.0.0.1:9/v1")) as running:
        done = subprocess.run(
            [CTXBUDGET, "serve", "--port", str(running.port)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env={**os.environ, "HOME": str(tmp_path)},
        )
    assert done.returncode == 1
    assert (
        f"ctxbudget: port {running.port} on 127.0.0.1 is in use, by ctxbudget already running "
        f"there (its report: `ctxbudget report`, or {running.root}/context/budget; stop it first "
        "to restart it): pass --port or set proxy.port"
    ) in done.stderr
