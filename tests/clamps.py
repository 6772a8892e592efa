"""Clamps for tests that hand one to `create_app`. A large body's clamp runs in the offload
worker, which imports it by name: it lives here, in a module that imports nothing heavy (the
worker importing a test module took ~7 s: the SDKs those import)."""

from __future__ import annotations

from typing import Any

from ctxbudget.caps import ClampResult


def broken_clamp(
    request: dict[str, Any], caps: Any, *, tools: Any = None, memo: Any = None
) -> ClampResult:
    """A clamp with a bug."""
    raise ValueError("boom")
