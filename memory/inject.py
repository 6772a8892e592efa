"""Put recalled memories into a chat request without breaking the provider's prompt cache.

Default placement `user`: the block is appended to the *last user message*, so the system
prompt and every earlier turn stay byte-identical and the cached prefix holds even when the
memories change. Placement `system` appends it to the system prompt instead (to the last user
message when the request has no system prompt), in the form
`User context:` / `- Preference: Therapy Thursdays 3pm (2 weeks ago, you told me)`.
"""

from __future__ import annotations

from typing import Any, Literal

from ctxbudget.memory.types import Memory

Placement = Literal["user", "system"]
DAY = 86_400.0


def age(seconds: float) -> str:
    days = int(seconds // DAY)
    if days < 1:
        return "today"
    if days < 2:
        return "yesterday"
    if days < 14:
        return f"{days} days ago"
    if days < 60:
        return f"{days // 7} weeks ago"
    return f"{days // 30} months ago"


def line(memory: Memory, *, now: float) -> str:
    """`- Preference: Therapy Thursdays 3pm (2 weeks ago, you told me)`"""
    who = "you told me" if memory.source == "user_explicit" else "inferred"
    return f"- {memory.category.capitalize()}: {memory.text} ({age(now - memory.created)}, {who})"


def block(lines: list[str]) -> str:
    return "User context:\n" + "\n".join(lines)


def inject(messages: list[Any], lines: list[str], placement: Placement) -> list[Any]:
    """A new message list with the memory block placed; the input is not changed."""
    if not lines:
        return messages
    text = block(lines)
    roles = ("system", "developer") if placement == "system" else ("user",)
    indices = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") in roles]
    if not indices and placement == "system":  # no system prompt to extend: the user turn
        return inject(messages, lines, "user")
    if not indices:
        return messages
    index = indices[0] if placement == "system" else indices[-1]
    message = messages[index]
    content = message.get("content")
    if isinstance(content, str):
        new_content: Any = f"{content}\n\n{text}"
    elif isinstance(content, list):
        new_content = [*content, {"type": "text", "text": text}]
    else:
        return messages
    out = list(messages)
    out[index] = {**message, "content": new_content}
    return out
