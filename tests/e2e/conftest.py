from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.standin import StandIn, run_standin


@pytest.fixture(scope="session")
def standin_server() -> Iterator[StandIn]:
    with run_standin() as server:
        yield server


@pytest.fixture
def standin(standin_server: StandIn) -> StandIn:
    standin_server.reset()
    return standin_server
