"""Each package states its public surface in a sorted `__all__` that really exists."""

from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize("name", ["caps", "memory", "proxy"])
def test_all_is_sorted_and_importable(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(exported)
    for attr in exported:
        assert hasattr(module, attr), f"{name}.{attr}"
