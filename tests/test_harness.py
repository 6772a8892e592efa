"""What the test run itself relies on to stay fast on a busy 2-core machine (issue 34): where
its temporary files go, and that the in-process layer never imports litellm (checked at the
end of every run: `tests/conftest.py` `pytest_sessionfinish`, on one process or on xdist's
workers), and when the fast layer runs on two workers."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest


def _room(root: str) -> int:
    disk = os.statvfs(root)
    return disk.f_bavail * disk.f_frsize


def test_temporary_files_are_in_memory_where_the_machine_has_room(tmp_path: Path) -> None:
    # Each in-process app writes two SQLite files and the report's schema: on the disk every
    # commit waited for it (an app took 125 ms at load 8, 65 ms on a tmpfs).
    if (
        os.environ.get("TMPDIR")
        or not os.access("/dev/shm", os.W_OK)
        or _room("/dev/shm") < 1 << 30
    ):
        assert not str(tmp_path).startswith("/dev/shm/")
        return
    assert str(tmp_path).startswith("/dev/shm/")
    assert tempfile.gettempdir() == "/dev/shm"


def test_the_fast_layer_takes_two_workers_where_it_has_two_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # two workers beat one process on a 2-core machine at any load (the runnable processes
    # share the cores), never more than two (each collects and imports again: ~4 s of CPU)
    from tests import conftest

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert conftest.pytest_xdist_auto_num_workers(SimpleNamespace()) == 0
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert conftest.pytest_xdist_auto_num_workers(SimpleNamespace()) == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert conftest.pytest_xdist_auto_num_workers(SimpleNamespace()) == 2


def test_litellm_imported_in_an_xdist_worker_fails_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker's own end of session cannot fail the run (its controller decides the exit
    status): it hands what it found to the controller, whose end of session fails it."""
    from tests import conftest

    monkeypatch.setattr(conftest, "_LITELLM_FIRST", ["tests/x.py::test_routes_through_it"])
    monkeypatch.setattr(conftest, "_LITELLM_FAILED", [])
    output: dict[str, Any] = {}
    worker = SimpleNamespace(items=[], config=SimpleNamespace(workeroutput=output), exitstatus=0)
    conftest.pytest_sessionfinish(worker, 0)  # type: ignore[arg-type]
    assert worker.exitstatus == 0 and "test_routes_through_it" in output["litellm"][0]

    monkeypatch.setattr(conftest, "_LITELLM_FIRST", [])  # the controller runs no test
    conftest.pytest_testnodedown(SimpleNamespace(workeroutput=output), None)
    plugins = SimpleNamespace(get_plugin=lambda name: None)
    controller = SimpleNamespace(items=[], config=SimpleNamespace(pluginmanager=plugins))
    controller.exitstatus = 0
    conftest.pytest_sessionfinish(controller, 0)  # type: ignore[arg-type]
    assert controller.exitstatus == pytest.ExitCode.TESTS_FAILED
