"""Memory and web_fetch tool results (placeholder: being written)."""

from __future__ import annotations

from caps.types import Caps, Message, Segment, ToolNames


def clamp_tool_results(
    messages: list[Message], caps: Caps, tools: ToolNames
) -> tuple[list[Message], list[Segment]]:
    """Clamp every recognised tool result in `messages`; return the same list if none changed."""
    return messages, []
