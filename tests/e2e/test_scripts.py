"""scripts/serve as a new user runs it from a fresh clone (issue 23): it finds the config every
other command finds, and makes ./ctxbudget.jsonc from the commented example on the first run
(it used to serve the tracked config.example.jsonc, which `ctxbudget report` never read)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx

from tests.e2e.server import CTXBUDGET, free_port

ROOT = Path(__file__).resolve().parents[2]


def _checkout(tmp_path: Path) -> Path:
    """A copy of the checkout's scripts and example, its .venv this one's (already set up:
    the stamp says so, so scripts/setup installs nothing)."""
    checkout = tmp_path / "ctxbudget"
    (checkout / "scripts").mkdir(parents=True)
    for name in ("scripts/serve", "scripts/setup", "pyproject.toml", "config.example.jsonc"):
        shutil.copy2(ROOT / name, checkout / name)
    venv = checkout / ".venv" / "bin"
    venv.mkdir(parents=True)
    # never this venv's pip: an install here would land in the venv the tests run from
    python = venv / "python"
    python.write_text(
        '#!/bin/sh\ncase "$*" in *pip*) echo "no pip in this test" >&2; exit 1;; esac\n'
        f'exec {Path(CTXBUDGET).parent / "python"} "$@"\n'
    )
    python.chmod(0o755)
    (venv / "ctxbudget").symlink_to(CTXBUDGET)
    sha = hashlib.sha256((checkout / "pyproject.toml").read_bytes()).hexdigest()
    (checkout / ".venv" / ".ctxbudget-installed").write_text(f"{sha} serve\n")
    return checkout


def _serve(checkout: Path, env: dict[str, str], tmp_path: Path) -> str:
    """Run scripts/serve until its report answers; what it said."""
    port = free_port()
    log_path = tmp_path / f"serve-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(checkout / "scripts" / "serve"), "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                assert process.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, log_path.read_text()
                try:
                    r = httpx.get(f"http://127.0.0.1:{port}/context/budget", timeout=5)
                    if r.status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.05)
        finally:
            process.terminate()
            process.wait(timeout=15)
    return log_path.read_text()


def test_serve_creates_and_then_uses_the_config_every_command_finds(tmp_path: Path) -> None:
    checkout, home = _checkout(tmp_path), tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXBUDGET")}
    env["HOME"] = str(home)
    config = checkout / "ctxbudget.jsonc"

    first = _serve(checkout, env, tmp_path)
    assert f"scripts/serve: created {config} from config.example.jsonc" in first
    assert config.read_text() == (ROOT / "config.example.jsonc").read_text()
    assert f"ctxbudget: using config {config}\n" in first
    assert "installing" not in first

    again = _serve(checkout, env, tmp_path)
    assert "created" not in again and f"ctxbudget: using config {config}\n" in again
    # and `ctxbudget report` run beside it reads the same file
    report = subprocess.run(
        [CTXBUDGET, "report", "--json"], cwd=checkout, env=env, capture_output=True, text=True
    )
    assert report.stderr == f"ctxbudget: using config {config}\n"

    # a config named some other way is left to ctxbudget: nothing is created
    config.unlink()
    named = tmp_path / "mine.jsonc"
    named.write_text("{}")
    told = _serve(checkout, {**env, "CTXBUDGET_CONFIG": str(named)}, tmp_path)
    assert not config.exists() and f"ctxbudget: using config {named}" in told


def test_setup_on_a_fresh_clone_says_only_what_it_does(tmp_path: Path) -> None:
    """A fresh clone has a .venv without the install stamp: scripts/setup said
    `line 22: .venv/.ctxbudget-installed: No such file or directory` before installing."""
    checkout = _checkout(tmp_path)
    (checkout / ".venv" / ".ctxbudget-installed").unlink()
    done = subprocess.run(
        [str(checkout / "scripts" / "setup"), "serve"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    said = done.stdout + done.stderr
    assert "== installing ctxbudget into .venv" in said  # it went on to install (refused here)
    assert "No such file" not in said, said
    assert "line " not in said.split("== installing")[0], said
