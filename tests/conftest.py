"""Fixtures shared by every test folder: a real PostgreSQL cluster, started once per session
when a test asks for it (`tests/pg.py`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.pg import Cluster, postgres_cluster


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    with postgres_cluster() as cluster:
        yield cluster


@pytest.fixture
def pg_url(pg_cluster: Cluster) -> str:
    """A new empty database on the session's cluster."""
    return pg_cluster.new_database()
