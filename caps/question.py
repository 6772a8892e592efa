"""The question a tool result answers: the user's turn that led to the call, and the call's
own arguments.

A query-aware clamp must give the same bytes every turn, or it breaks the prompt cache it is
meant to save. It does by construction: the question is made only of what precedes the result
in the conversation — the latest user turn before the assistant message that made the call,
and that call's arguments — and an agent resends those bytes unchanged, so later turns asking
other things never move it (`docs/architecture.md`, "Clamps that keep what was asked"). What an
agent adds or changes around a turn is left out: OpenClaw's internal-context message (at the
end of a chat or Messages request, after the first user message in Responses, new every turn),
its `[Sun 2026-11-22 11:28 UTC]` stamp and the `Runtime:` line it moves into the first user
message; Claude Code's `<system-reminder>` blocks. A user message of nothing else is not a turn.

>>> asked = user_texts({"role": "user", "content": "[Sun 2026-11-22 11:28 UTC] When does "
...     "the ferry leave?\\n\\nRuntime: agent=main | host=vm"})
>>> question(asked, '{"url": "https://example.com/schedules/ferry?island=arran"}')
'When does the ferry leave?\\n/schedules/ferry island=arran'
>>> user_texts({"role": "user", "content": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\\n…"}) is None
True
>>> question(None, '{"command": "pytest -x tests/test_api.py", "timeout": 60}')
'pytest -x tests/test_api.py'
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import unquote, urlsplit

INTERNAL_CONTEXT = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"
_REMINDER = "<system-reminder>"
_REMINDER_END = "</system-reminder>"
_STAMP = re.compile(r"^\[[^\]\n]{3,64}\]\s*")
_RUNTIME = re.compile(r"^(?:Runtime|Reasoning): .*$", re.M)
QUESTION_HEAD = 2_000
"""Characters from the start of a long user turn that make the question."""
QUESTION_TAIL = 2_000
"""And from its end (a pasted log ends with what the user asks about it)."""
MAX_ARGUMENTS = 2_000
"""Characters of a call's arguments that make the question (a `write` call's whole file
says nothing about what to keep of the output)."""


def user_texts(message: Any) -> tuple[str, ...] | None:
    """The texts of a chat user message that are the user's own (a string content, or its
    text parts); None when it has none: agent-internal context or reminders only."""
    if not isinstance(message, dict) or message.get("role") != "user":
        return None
    content = message.get("content")
    if isinstance(content, str):
        texts: tuple[str, ...] = (content,)
    elif isinstance(content, list):
        texts = tuple(
            p["text"]
            for p in content
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        )
    else:
        return None
    own = tuple(kept for t in texts if (kept := _own(t)))
    return own or None


def _own(text: str) -> str:
    """`text` less agent reminders; "" when it is agent-internal or nothing else is left."""
    if text.lstrip().startswith(INTERNAL_CONTEXT):
        return ""
    if _REMINDER not in text:
        return text if text.strip() else ""
    pieces, at = [], 0
    while (start := text.find(_REMINDER, at)) >= 0:
        end = text.find(_REMINDER_END, start)
        if end < 0:
            break
        pieces.append(text[at:start])
        at = end + len(_REMINDER_END)
    pieces.append(text[at:])
    return "".join(pieces).strip()


def question(asked: tuple[str, ...] | None, arguments: str | None) -> str:
    """The question: the user's turn (stamp and runtime lines left out; its first and last
    2,000 characters when longer) and the text of the call's arguments (a URL's path and
    query, a pattern, a command), one per line."""
    lines: list[str] = []
    if asked:
        text = "\n".join(asked)
        if len(text) > QUESTION_HEAD + QUESTION_TAIL:  # cut first: a pasted megabyte
            text = f"{text[:QUESTION_HEAD]}\n{text[-QUESTION_TAIL:]}"
        text = _RUNTIME.sub("", _STAMP.sub("", text)).strip()
        if text:
            lines.append(text)
    if arguments:
        said = " ".join(_said(_parse(arguments[: 4 * MAX_ARGUMENTS])))[:MAX_ARGUMENTS]
        if said:
            lines.append(said)
    return "\n".join(lines)


def _parse(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments  # cut, or not JSON: its words are still what was asked


def _said(value: Any) -> list[str]:
    """The strings of a call's arguments (URLs as their path and query), depth first."""
    out: list[str] = []
    stack = [value]
    while stack and len(out) < 64:
        item = stack.pop()
        if isinstance(item, str):
            out.append(_url_words(item))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return [s for s in out if s]


def _url_words(text: str) -> str:
    """A URL's path and query, decoded (its host is the same for every passage of its page);
    any other string as it is."""
    if not text.startswith(("http://", "https://")) or " " in text:
        return text
    try:
        parts = urlsplit(text)
    except ValueError:
        return text
    query = unquote(parts.query).replace("&", " ").replace("+", " ")
    return " ".join(x for x in (unquote(parts.path), query) if x and x != "/")
