"""Running the real agents (OpenClaw, Claude Code, Codex) as the tests and bench/record.py do."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


def run_agent(
    argv: list[str], *, env: dict[str, str], cwd: Path, timeout: float
) -> tuple[subprocess.CompletedProcess[str], bool]:
    """Run an agent in its own process group, killed with whatever helpers it left behind when
    it is done or after `timeout` seconds; the result, and whether it was the timeout."""
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    late = False
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        late = True
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(argv, process.returncode, out, err), late
