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


def test_caps_imports_nothing_of_ours_but_caps() -> None:
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "caps"
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith(("proxy", "memory")), path
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith(("proxy", "memory")), path
