"""Fixtures shared by every test folder: a real PostgreSQL cluster, started once per session
when a test asks for it (`tests/pg.py`), and `backend`, which runs a memory-store test on
SQLite and on PostgreSQL."""

from __future__ import annotations

import sys

# The run keeps its bytecode caches (in the gitignored __pycache__ folders) even under
# PYTHONDONTWRITEBYTECODE=1, as this machine's shells have it: without them each run compiled
# the project again and pytest rewrote every test module's asserts again (~4 s of the
# in-process layer), and each offload worker a test starts compiled what it imports. Set
# before the imports below, so the project's modules they load are cached too.
sys.dont_write_bytecode = False

import os  # noqa: E402

# Every request's reused objects are checked (proxy/cache/resent.py, caps/_kept.py): a test
# whose path changes a shared message in place fails, here and in every server it starts
# (they inherit the environment).
os.environ["CTXBUDGET_CHECK_RESENT"] = "1"

import gc  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402


def _in_memory_tmp(root: str = "/dev/shm", room: int = 1 << 30) -> None:
    """Tests' temporary files (`tmp_path`, `tempfile`) in memory where the machine has a tmpfs
    with room: an in-process app opens two SQLite files and writes the report's schema, whose
    every commit waits for the disk (~60 ms of each app's ~120 ms on a loaded machine, and
    hundreds of tests make one). A TMPDIR the caller set is kept, as is the disk where the
    tmpfs is small (a container's 64 MB /dev/shm)."""
    if os.environ.get("TMPDIR") or not os.access(root, os.W_OK):
        return
    disk = os.statvfs(root)
    if disk.f_bavail * disk.f_frsize >= room:
        tempfile.tempdir = root


_in_memory_tmp()

from ctxbudget.memory import MemoryLimits, MemoryStore, SQLiteMemoryStore  # noqa: E402
from tests.encodings import remembered_encodings  # noqa: E402
from tests.inproc import close_offloads  # noqa: E402
from tests.pg import Cluster, postgres_cluster  # noqa: E402


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported (the SDKs, hypothesis, the app: ~600,000 objects) lives until
    the run ends: frozen out of the collector's full passes, each of which walked all of it
    (~0.2 s, ~14 a run), and out of the one at exit."""
    # Hypothesis' plugin imports it by the end of any run. Imported before the freeze, its
    # entry points register their PRNGs (`register_random`) while it can still see who holds
    # them: it looks with `gc.get_referrers`, which skips frozen objects, and warns.
    import hypothesis  # noqa: F401

    gc.freeze()


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """The fast layer as a whole (`pytest -m "not e2e and not browser"`, no paths) asks
    pytest-xdist, when installed, how many workers to run (`-n auto`): two where there are
    two cores. A run given paths, `-n`, or the e2e layer (servers, ports, processes of
    its own) runs as it is told."""
    if (
        config.pluginmanager.hasplugin("xdist")
        and not hasattr(config, "workerinput")  # a worker: its controller decided
        and config.getoption("numprocesses", None) is None
        and config.args_source == pytest.Config.ArgsSource.TESTPATHS
        and "not e2e" in (config.getoption("markexpr") or "")
        and not config.getoption("collectonly")
    ):
        config.option.numprocesses = "auto"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: two workers where the run may use two cores, busy or not. Each worker
    collects and imports again (~4 s of CPU), and still, measured on a 2-core machine, two
    workers took 41 s against one process's 67 s idle, 62 s against 78 s beside one busy
    core (`yes`), 87 s against 123 s beside two: a process shares a busy core by the
    runnable processes, so two of ours get more of the machine than one."""
    return 2 if len(os.sched_getaffinity(0)) >= 2 else 0


_LITELLM_FIRST: list[str] = []
"""The test after which litellm was first found imported."""


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    if not _LITELLM_FIRST and "litellm" in sys.modules:
        _LITELLM_FIRST.append(nodeid)


_LITELLM_FAILED: list[str] = []
"""What the check of each xdist worker found (`pytest_testnodedown`), for its controller."""


@pytest.hookimpl(tryfirst=True)  # before xdist's worker sends its output
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The in-process layer never imports litellm: it costs a run ~5 s of CPU (on a thread
    the rest of the run shares the GIL with, when an app with a route preloads it) and
    ~165 MB. Routes through litellm are the e2e layer's; a run with no e2e test fails here,
    naming the test that imported it (an xdist worker hands what it found to its
    controller, which fails the run)."""
    found = list(_LITELLM_FAILED)
    if _LITELLM_FIRST and not any(item.get_closest_marker("e2e") for item in session.items):
        found.append(
            f"litellm was imported by the in-process layer, first by {_LITELLM_FIRST[0]} "
            "(~5 s, ~165 MB): leave routes through it to tests/e2e/"
        )
    if not found:
        return
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["litellm"] = found
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        for line in found:
            reporter.write_line(line, red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """An xdist worker done: what its litellm check found (`pytest_sessionfinish`)."""
    _LITELLM_FAILED.extend(getattr(node, "workeroutput", {}).get("litellm", []))


@pytest.fixture(scope="session", autouse=True)
def _shared_offloads() -> Iterator[None]:
    """Stop the run's shared offload workers (`tests.inproc.shared_offload`) at its end."""
    yield
    close_offloads()


@pytest.fixture(scope="session", autouse=True)
def _remembered_encodings() -> Iterator[None]:
    """Token ids encoded once for the run, not once per test's app (`tests/encodings.py`)."""
    with remembered_encodings():
        yield


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    with postgres_cluster() as cluster:
        yield cluster


@pytest.fixture
def pg_url(pg_cluster: Cluster) -> str:
    """A new empty database on the session's cluster (a schema of its own, as fast)."""
    return pg_cluster.new_schema()


class Backend:
    """Where a memory store keeps its data: `open()` opens it as another process would (the
    same SQLite file, or the same PostgreSQL database through a pool of its own)."""

    def __init__(self, name: str, tmp_path: Path, url: str | None) -> None:
        self.name = name
        self._path = tmp_path / "m.db"
        self.url = url
        self.opened: list[MemoryStore] = []
        """Stores opened through `open`, closed after the test (a pool left open keeps its
        connections: a whole suite of them would reach the server's max_connections)."""

    def open(
        self, *, limits: MemoryLimits | None = None, clock: Callable[[], float] = time.time
    ) -> MemoryStore:
        store: MemoryStore
        if self.url is None:
            store = SQLiteMemoryStore(self._path, limits=limits, clock=clock)
        else:
            from ctxbudget.memory.pg import PgDatabase
            from ctxbudget.memory.pgstore import PgMemoryStore

            store = PgMemoryStore(PgDatabase(self.url, pool_size=4), limits=limits, clock=clock)
        self.opened.append(store)
        return store


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Each memory-store test once on a SQLite file and once on a fresh PostgreSQL database."""
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    found = Backend(request.param, tmp_path, url)
    yield found
    for store in found.opened:
        try:
            store.close()
        except Exception:  # noqa: BLE001 - closed by the test already, or never opened
            pass
