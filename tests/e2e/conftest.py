from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.server import close_clients
from tests.standin import StandIn, run_standin


@pytest.fixture(autouse=True)
def _close_sdk_clients() -> Iterator[None]:
    yield
    close_clients()


@pytest.fixture(scope="session")
def standin_server() -> Iterator[StandIn]:
    with run_standin() as server:
        yield server


@pytest.fixture
def standin(standin_server: StandIn) -> StandIn:
    standin_server.reset()
    return standin_server
