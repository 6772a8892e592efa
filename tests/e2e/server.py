"""Run the real proxy (`ctxbudget serve`, a uvicorn process) for end-to-end tests."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import openai

CTXBUDGET = str(Path(sys.executable).parent / "ctxbudget")
_Client = TypeVar("_Client")
CLIENTS: list[Any] = []
"""SDK clients to close after the test (each holds a pool of sockets)."""


def sdk(**kwargs: Any) -> openai.OpenAI:
    """An `openai.OpenAI` client, closed after the test (its pool holds sockets)."""
    client = openai.OpenAI(**kwargs)
    CLIENTS.append(client)
    return client


def tracked(client: _Client) -> _Client:
    """`client` (any SDK client with `close()`), closed after the test like `sdk()`'s."""
    CLIENTS.append(client)
    return client


def close_clients() -> None:
    while CLIENTS:
        CLIENTS.pop().close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ProxyServer:
    """A running `ctxbudget serve` process."""

    def __init__(
        self, process: subprocess.Popen[bytes], port: int, config_path: Path, log_path: Path
    ) -> None:
        self.process = process
        self.log_path = log_path
        self.port = port
        self.config_path = config_path
        self.root = f"http://127.0.0.1:{port}"
        self.base_url = f"{self.root}/v1"

    def write_config(self, config: dict[str, Any]) -> None:
        """Replace the config file (the running server picks it up on its next request)."""
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(config, indent=2))
        os.replace(tmp, self.config_path)

    def report(self) -> dict[str, Any]:
        r = httpx.get(f"{self.root}/context/budget", timeout=10)
        r.raise_for_status()
        data: dict[str, Any] = r.json()
        return data

    def output(self) -> str:
        """What the server has printed so far."""
        return self.log_path.read_text(errors="replace")


def base_config(tmp_path: Path, upstream_url: str, **budget: Any) -> dict[str, Any]:
    """A config pointing at `upstream_url` with its report in `tmp_path`."""
    return {
        "proxy": {"upstream": {"baseUrl": upstream_url, "readTimeoutSeconds": 30}},
        "agents": {"defaults": {"contextBudget": {"enabled": True, **budget}}},
        "report": {"path": str(tmp_path / "report.db")},
        "memory": {"store": {"path": str(tmp_path / "memory.db")}},
    }


def standin_config(tmp_path: Path, standin: Any) -> dict[str, Any]:
    """`base_config` with both upstreams the stand-in and no keys of our own (the client's
    credentials go on)."""
    config = base_config(tmp_path, standin.base_url)
    config["proxy"]["upstream"]["apiKeyEnv"] = None
    config["proxy"]["anthropic"] = {"baseUrl": standin.root, "apiKeyEnv": None}
    return config


@contextmanager
def serve(
    tmp_path: Path,
    config: dict[str, Any],
    *,
    env: dict[str, str] | None = None,
    workers: int = 1,
    extra_args: tuple[str, ...] = (),
    clock: Path | None = None,
    file_limit: int | None = None,
) -> Iterator[ProxyServer]:
    """Start `ctxbudget serve` with `config`; wait until it answers /healthz. With `clock`
    (a `tests.simclock.ClockFile`'s path) its wall clock runs that file's seconds ahead; with
    `file_limit` the process may hold at most that many open files (`ulimit -n`)."""
    config_path = tmp_path / "ctxbudget.jsonc"
    config_path.write_text(json.dumps(config, indent=2))
    port = free_port()
    full_env = {
        k: v for k, v in os.environ.items() if not k.startswith(("CTXBUDGET", "OPENAI_API_KEY"))
    }
    full_env.update(env or {})
    command = [CTXBUDGET]
    if clock is not None:
        command = [sys.executable, "-m", "tests.simclock", str(clock)]
        full_env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    log_path = tmp_path / f"server-{port}.log"
    log_file = log_path.open("wb")
    process = subprocess.Popen(
        [
            *command,
            "serve",
            "--config",
            str(config_path),
            "--port",
            str(port),
            "--workers",
            str(workers),
            *extra_args,
        ],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env=full_env,
        cwd=tmp_path,
        preexec_fn=None if file_limit is None else _limit_files(file_limit),
    )
    server = ProxyServer(process, port, config_path, log_path)
    try:
        _wait_healthy(server)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log_file.close()


def _limit_files(n: int) -> Callable[[], None]:
    def limit() -> None:  # runs in the child, before exec
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

    return limit


def _wait_healthy(server: ProxyServer, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"ctxbudget serve exited early:\n{server.output()}")
        try:
            if httpx.get(f"{server.root}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError("ctxbudget serve did not become healthy in time")
