"""Bootstrap files in OpenClaw's `# Project Context` block (placeholder: being written)."""

from __future__ import annotations

from caps.types import Segment


def clamp_system_text(text: str, cap: int | None) -> tuple[str, list[Segment]]:
    """Clamp each bootstrap file body in one system-prompt text to `cap` UTF-16 units."""
    return text, []
