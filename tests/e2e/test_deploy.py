"""The deployment files, run: `deploy/ctxbudget.service`'s ExecStart with the unit's
environment, `deploy/ctxbudget.env` and `deploy/ctxbudget.jsonc` (paths, ports and the
upstream substituted), then nginx with `deploy/nginx.conf` (ports and certificate
substituted) in front of it, replies streaming through both to a real client.

nginx runs as this test's own user (its workers too) on unprivileged loopback ports. Without
nginx or openssl the nginx tests are skipped (`apt-get install -y --no-install-recommends nginx
openssl`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import json5
import pytest

from tests.e2e.deploy import DEPLOY, INSTALL, NAME, env_file, unit_entries
from tests.e2e.server import CTXBUDGET, free_port
from tests.standin import StandIn


@dataclass
class Deployed:
    process: subprocess.Popen[bytes]
    port: int
    env: dict[str, str]
    """What the unit put in the service's environment."""
    state: Path
    """Stands for /var/lib/ctxbudget."""
    log: Path

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def deployed(tmp_path: Path, standin: StandIn) -> Iterator[Deployed]:
    """`ctxbudget serve` as the unit starts it, with the deploy config and keys."""
    unit = unit_entries()
    port = free_port()
    state_root = tmp_path / "var-lib"  # %S
    state = state_root / "ctxbudget"  # StateDirectory=ctxbudget
    state.mkdir(parents=True)
    config = json5.loads((DEPLOY / "ctxbudget.jsonc").read_text())
    assert config["proxy"]["port"] == 4141
    config["proxy"]["port"] = port
    config["proxy"]["upstream"]["baseUrl"] = standin.base_url
    config["proxy"]["anthropic"]["baseUrl"] = standin.root
    text = json.dumps(config).replace("/var/lib/ctxbudget", str(state))
    config_path = tmp_path / "ctxbudget.jsonc"
    config_path.write_text(text)

    (exec_start,) = unit["Service.ExecStart"]
    argv = shlex.split(exec_start)
    assert argv[:2] == ["/opt/ctxbudget/bin/ctxbudget", "serve"]
    assert argv[2:] == ["--config", "/etc/ctxbudget/ctxbudget.jsonc"]
    argv = [CTXBUDGET, "serve", "--config", str(config_path)]

    assert unit["Service.EnvironmentFile"] == ["/etc/ctxbudget/env"]
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", **env_file()}
    for assignment in unit.get("Service.Environment", []):
        key, _, value = assignment.partition("=")
        env[key] = value.replace("%S", str(state_root))
    log = tmp_path / "service.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, env=env, cwd="/", stdout=out, stderr=subprocess.STDOUT)
    service = Deployed(process, port, env, state, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, f"the service exited:\n{service.output()}"
            try:
                if httpx.get(f"{service.root}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"the service did not come up:\n{service.output()}"
            time.sleep(0.05)
        yield service
    finally:
        if process.poll() is None:
            # the unit's KillSignal, within its TimeoutStopSec
            process.send_signal(getattr(signal, unit["Service.KillSignal"][0]))
            stop = float(unit["Service.TimeoutStopSec"][0].removesuffix("s"))
            try:
                process.wait(timeout=stop)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                pytest.fail(f"the service did not stop within TimeoutStopSec={stop}")


def test_the_units_command_and_environment_serve_with_the_deploy_config(
    deployed: Deployed, standin: StandIn
) -> None:
    keys = env_file()
    alice = keys["CTXBUDGET_PROXY_KEYS"].split(",")[0].split("=", 1)[1]
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    url = f"{deployed.root}/v1/chat/completions"
    assert httpx.post(url, json=body, timeout=30).status_code == 401, "keys are required"
    r = httpx.post(url, json=body, headers={"authorization": f"Bearer {alice}"}, timeout=30)
    assert r.status_code == 200, r.text
    # the provider key from the environment file, never the proxy key
    assert standin.received[-1].headers["authorization"] == f"Bearer {keys['OPENAI_API_KEY']}"

    metrics = f"{deployed.root}/metrics"
    scraper = {"authorization": f"Bearer {keys['CTXBUDGET_METRICS_KEY']}"}
    assert httpx.get(metrics, headers={"authorization": f"Bearer {alice}"}).status_code == 403
    assert httpx.get(metrics, headers=scraper).status_code == 200

    # the stores are in the state directory, and `~` is too (HOME=%S/ctxbudget)
    assert deployed.env["HOME"] == str(deployed.state)
    assert {p.name for p in deployed.state.iterdir()} >= {"report.db", "memory.db"}

    # a stop: uvicorn finishes, then dies of the signal it got, which systemd counts as a
    # clean exit (so Restart=on-failure does not restart it)
    deployed.process.send_signal(signal.SIGTERM)
    assert deployed.process.wait(timeout=30) in (0, -signal.SIGTERM)
    output = deployed.output()
    assert "Finished server process" in output
    assert "Traceback" not in output


# -- nginx in front ----------------------------------------------------------------------


def _binary(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if found is None:
        pytest.skip(f"{name} is not installed: {INSTALL}")
    return found


def _sub(text: str, pattern: str, new: str, count: int) -> str:
    """Replace `pattern` exactly `count` times: an edit to the example must not leave the test
    running something else than it shows."""
    out, n = re.subn(pattern, new, text)
    assert n == count, f"{pattern!r} matched {n} times in deploy/nginx.conf, expected {count}"
    return out


@dataclass
class Nginx:
    https: int
    http: int
    cert: Path


@pytest.fixture
def nginx(tmp_path: Path, deployed: Deployed) -> Iterator[Nginx]:
    """nginx with deploy/nginx.conf in front of the deployed service."""
    binary = _binary("nginx")
    openssl = _binary("openssl")
    run = tmp_path / "nginx"
    run.mkdir()
    cert, key = run / "cert.pem", run / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
        + ["-nodes", "-days", "1", "-subj", f"/CN={NAME}", "-addext", f"subjectAltName=DNS:{NAME}"]
        + ["-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    https, http = free_port(), free_port()
    site = (DEPLOY / "nginx.conf").read_text()
    site = _sub(site, r"server 127\.0\.0\.1:4141;", f"server 127.0.0.1:{deployed.port};", 1)
    site = _sub(site, r"listen 443 ssl;", f"listen 127.0.0.1:{https} ssl;", 1)
    site = _sub(site, r"listen 80;", f"listen 127.0.0.1:{http};", 1)
    site = _sub(site, r"listen \[::\]:\d+( ssl)?;\n", "", 2)  # loopback IPv4 is enough here
    site = _sub(site, r"ssl_certificate +/\S+;", f"ssl_certificate {cert};", 1)
    site = _sub(site, r"ssl_certificate_key +/\S+;", f"ssl_certificate_key {key};", 1)
    (run / "site.conf").write_text(site)
    temp = "".join(
        f"{kind}_temp_path {run / kind};\n" for kind in ("client_body", "proxy", "fastcgi")
    ) + "".join(f"{kind}_temp_path {run / kind};\n" for kind in ("uwsgi", "scgi"))
    user = f"user {_user_name()};\n" if os.geteuid() == 0 else ""
    (run / "nginx.conf").write_text(
        f"{user}worker_processes 1;\npid {run / 'nginx.pid'};\n"
        f"error_log {run / 'error.log'} info;\nevents {{ worker_connections 64; }}\n"
        f"http {{\naccess_log {run / 'access.log'};\n{temp}include {run / 'site.conf'};\n}}\n"
    )
    base = [binary, "-p", str(run), "-e", str(run / "error.log"), "-c", str(run / "nginx.conf")]
    checked = subprocess.run([*base, "-t"], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    process = subprocess.Popen(
        [*base, "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            assert process.poll() is None, (run / "error.log").read_text()
            try:
                httpx.get(f"http://127.0.0.1:{http}/", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "nginx did not come up"
                time.sleep(0.05)
        yield Nginx(https, http, cert)
    finally:
        process.terminate()
        process.wait(timeout=10)


def _user_name() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def _client(nginx: Nginx) -> httpx.Client:
    """A client of https://ctxbudget.example.com, which is nginx on a loopback port."""
    context = ssl.create_default_context(cafile=str(nginx.cert))
    context.check_hostname = False  # the URL says 127.0.0.1; the certificate is checked
    return httpx.Client(
        base_url=f"https://127.0.0.1:{nginx.https}",
        headers={"host": NAME, "authorization": "Bearer " + _alices_key()},
        verify=context,
        timeout=30,
    )


def _alices_key() -> str:
    return env_file()["CTXBUDGET_PROXY_KEYS"].split(",")[0].split("=", 1)[1]


def _arrivals(client: httpx.Client, path: str, body: dict[str, Any]) -> list[tuple[float, bytes]]:
    """(seconds since the request, line) for each SSE data line as the client gets it."""
    start = time.monotonic()
    out = []
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-context-budget-enabled"] == "true"
        for line in r.iter_lines():
            if line.startswith("data:"):
                out.append((time.monotonic() - start, line.encode()))
    return out


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/chat/completions",
            {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        ),
        (
            "/v1/messages",
            {
                "model": "claude-sonnet-4-5",
                "max_tokens": 64,
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            },
        ),
    ],
)
def test_sse_streams_through_nginx_chunk_by_chunk(
    nginx: Nginx, path: str, body: dict[str, Any]
) -> None:
    """Five chunks 0.4 s apart: each reaches the client when sent, not all at the end."""
    body = {**body, "x_standin": {"chunks": 5, "chunk_delay": 0.4}}
    with _client(nginx) as client:
        arrivals = _arrivals(client, path, body)
    times = [t for t, _ in arrivals]
    assert len(times) >= 7
    assert times[-1] - times[0] >= 1.5, f"all chunks arrived at once: {times}"
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert sum(gap >= 0.3 for gap in gaps) >= 4, f"chunks were held back: {times}"


def test_through_nginx_the_guard_still_checks_host_and_origin(nginx: Nginx) -> None:
    with _client(nginx) as client:
        assert client.get("/context/budget").status_code == 200  # the allowed name
        other = client.get("/context/budget", headers={"host": "rebound.attacker.test"})
        assert other.status_code == 421
        page = {"origin": "https://evil.test", "content-type": "application/json"}
        refused = client.post("/v1/chat/completions", headers=page, content=b"{}")
        assert refused.status_code == 403
    plain = httpx.get(f"http://127.0.0.1:{nginx.http}/v1/models", headers={"host": NAME})
    assert plain.status_code == 308
    assert plain.headers["location"] == f"https://{NAME}/v1/models"
