"""What the test run itself relies on to stay fast on a busy 2-core machine (issue 34): where
its temporary files go, and that the in-process layer never imports litellm (checked at the
end of every run: `tests/conftest.py` `pytest_sessionfinish`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


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
