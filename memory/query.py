"""The latest real user text of a chat request: what recall searches for.

Agent-internal blocks are skipped: OpenClaw 9.x ends every request with a
`<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>` user message, stamps user text with
`[Sun 2026-11-22 11:28 UTC]` and appends its `Runtime: ...` line to the first user message.
"""

from __future__ import annotations

import re
from typing import Any

INTERNAL_CONTEXT = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"
_STAMP = re.compile(r"^\[[^\]\n]{3,64}\]\s*")
_RUNTIME = re.compile(r"^(?:Runtime|Reasoning): .*$", re.M)


def message_text(message: dict[str, Any]) -> str | None:
    """The text of a message whose content is a string or text parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            p["text"]
            for p in content
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        ]
        return "\n".join(texts) if texts else None
    return None


def latest_user(messages: list[Any]) -> tuple[int, str] | None:
    """(index, raw text) of the latest user message that is not an agent-internal block."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        text = message_text(message)
        if text is None or text.lstrip().startswith(INTERNAL_CONTEXT):
            continue
        return index, text
    return None


def clean(text: str) -> str:
    """User text without OpenClaw's time stamp and runtime lines."""
    return _RUNTIME.sub("", _STAMP.sub("", text.strip())).strip()
