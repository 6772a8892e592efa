from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/e2e runs the real server: marked `e2e` (the inner loop is
    `pytest -m "not e2e and not browser"`)."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.e2e)
