"""The deployment files agree with systemd, the config loader and each other. They are run
for real (the unit's command, nginx in front) in `tests/e2e/test_deploy.py`."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from proxy.config.schema import load_config
from tests.e2e.deploy import DEPLOY, NAME, env_file, unit_entries
from tests.e2e.server import CTXBUDGET


def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed: apt-get install -y systemd")
    unit = (DEPLOY / "ctxbudget.service").read_text()
    # verify checks that ExecStart's program exists: this checkout's, not /opt's
    unit = unit.replace("/opt/ctxbudget/bin/ctxbudget", CTXBUDGET)
    (tmp_path / "ctxbudget.service").write_text(unit)
    out = subprocess.run(
        [analyze, "verify", "--man=no", str(tmp_path / "ctxbudget.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # any warning (an unknown or misspelt directive, a bad value) fails it too
    assert (out.returncode, out.stdout + out.stderr) == (0, "")


def test_the_unit_runs_as_its_own_unprivileged_user_in_a_read_only_system() -> None:
    unit = unit_entries()
    for key, value in {
        "DynamicUser": "yes",
        "StateDirectory": "ctxbudget",
        "NoNewPrivileges": "yes",
        "CapabilityBoundingSet": "",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "Restart": "on-failure",
    }.items():
        assert unit[f"Service.{key}"] == [value], key
    assert unit["Service.EnvironmentFile"] == ["/etc/ctxbudget/env"]  # no "-": keys required


def test_the_deploy_config_loads_and_the_env_file_holds_every_key_it_names() -> None:
    config = load_config(DEPLOY / "ctxbudget.jsonc", env={}, overrides={})
    proxy = config.proxy
    named = {
        proxy.upstream.api_key_env,
        proxy.anthropic.api_key_env,
        proxy.keys_env,
        proxy.admin_key_env,
        proxy.metrics_key_env,
    }
    assert set(env_file()) == named
    assert str(config.report.path).startswith("/var/lib/ctxbudget/")
    assert str(config.memory.store.path).startswith("/var/lib/ctxbudget/")
    assert proxy.host == "127.0.0.1"
    assert proxy.allowed_hosts == [NAME]
    # behind nginx every client has nginx's address: no cap per address (nginx caps them)
    assert proxy.limits.max_connections_per_client is None


def test_nginx_sends_to_the_proxy_under_the_name_it_allows_and_outwaits_it() -> None:
    config = load_config(DEPLOY / "ctxbudget.jsonc", env={}, overrides={})
    site = (DEPLOY / "nginx.conf").read_text()
    assert f"server {config.proxy.host}:{config.proxy.port};" in site
    assert re.findall(r"server_name (\S+);", site) == [NAME, NAME]
    assert "proxy_set_header Host $host;" in site
    assert "proxy_buffering off;" in site
    (read,) = re.findall(r"proxy_read_timeout (\d+)s;", site)
    assert int(read) > config.proxy.upstream.read_timeout_seconds
    (body,) = re.findall(r"client_max_body_size (\d+)m;", site)
    assert int(body) * 1024 * 1024 >= config.proxy.max_body_bytes
