"""A throwaway PostgreSQL cluster for the tests: Debian's `postgresql` package (installed by
`scripts/packages`), `initdb` in a temporary directory, its own port, stopped at the end.

The server refuses to run as root, so as root it runs as the `postgres` user (`runuser`);
otherwise as whoever runs the tests. Trust authentication on 127.0.0.1 only, fsync off: a
test cluster, never a real one.

    with postgres_cluster() as cluster:
        url = cluster.new_database()      # postgresql://postgres@127.0.0.1:PORT/t_<random>
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote


def bin_dir() -> Path | None:
    """The newest installed PostgreSQL's bin directory, or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: p.parts[-3])
    return found[-1].parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """A running test cluster."""

    def __init__(self, bin: Path, data: Path, port: int, as_user: list[str]) -> None:
        self.bin = bin
        self.data = data
        self.port = port
        self._as = as_user
        self._shared: str | None = None

    @property
    def url(self) -> str:
        """The `postgres` database's URL (for administration)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*self._as, *argv], capture_output=True, text=True, timeout=timeout, cwd="/"
        )
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stderr[-2000:]}")
        return done

    def new_database(self) -> str:
        """A new empty database, its URL."""
        name = "t_" + secrets.token_hex(6)
        self.run(str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
                 "-U", "postgres", name)  # fmt: skip
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def new_schema(self) -> str:
        """A new empty schema in the cluster's shared test database, as a URL whose
        connections use only it (`search_path`): as good as a new database for the stores,
        and ~50× faster to make (CREATE DATABASE copies a template: ~0.15 s)."""
        import psycopg

        if self._shared is None:
            self._shared = self.new_database()
        name = "s_" + secrets.token_hex(6)
        with psycopg.connect(self._shared, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {name}")
        return f"{self._shared}?options={quote(f'-c search_path={name}')}"

    def stop(self, mode: str = "fast") -> None:
        self.run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.data}"
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            " -c max_connections=200"
        )
        self.run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options, "-w", "-t", "60",
            "-l", str(self.data / "server.log"), "start",
        )  # fmt: skip


@contextmanager
def postgres_cluster() -> Iterator[Cluster]:
    """Start a cluster; stop it and remove its files at the end."""
    found = bin_dir()
    if found is None:
        missing = "PostgreSQL is not installed: scripts/packages installs Debian's postgresql"
        if "pytest" in sys.modules:  # a test that needs it is skipped, saying why
            import pytest

            pytest.skip(missing)
        raise RuntimeError(missing)
    root = Path(tempfile.mkdtemp(prefix="ctxbudget-pg-"))
    data = root / "data"
    as_user: list[str] = []
    if os.geteuid() == 0:  # the server refuses root
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(root, "postgres")
        root.chmod(0o700)
    cluster = Cluster(found, data, _free_port(), as_user)
    try:
        cluster.run(str(found / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust",
                    "-E", "UTF8", "--no-sync")  # fmt: skip
        cluster.start()
        yield cluster
    finally:
        try:
            cluster.stop("immediate")
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        for _ in range(50):  # the server's files go once it has exited
            try:
                shutil.rmtree(root)
                break
            except OSError:
                time.sleep(0.1)
