"""The latest real user text of a chat request: what recall searches for.

Agent-internal blocks are skipped: OpenClaw 9.x ends every request with a
`<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>` user message, stamps user text with
`[Sun 2026-11-22 11:28 UTC]` and appends its `Runtime: ...` line to the first user message.
Claude Code puts `<system-reminder>…</system-reminder>` blocks (its instruction files, a note
that a slash command is unknown, the date) beside the user's words in the same message, and
its environment as a `role: "system"` message after it: the user's own text is what is left
without the reminders, and a system message after it does not make the turn a tool loop.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

INTERNAL_CONTEXT = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"
REMINDER = "<system-reminder>"
_REMINDER_END = "</system-reminder>"
_CONTEXT_ROLES = ("system", "developer")
_RESULTS = ("tool_result", "function_call_output")
_TEXTS = ("text", "input_text")
_STAMP = re.compile(r"^\[[^\]\n]{3,64}\]\s*")
_RUNTIME = re.compile(r"^(?:Runtime|Reasoning): .*$", re.M)
RUNTIME_AGENT = "Runtime: agent="
"""How OpenClaw's runtime line names the agent a request is for (`Runtime: agent=main | …`)."""
_AGENT_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
QUERY_HEAD = 2_000
"""Characters from the start of a long user turn that recall reads (`excerpt`)."""
QUERY_TAIL = 2_000
"""Characters from its end."""
_SPACES = " \t\r\n"


@dataclass(frozen=True, kw_only=True)
class UserTurn:
    """The latest real user text of a request, as a wire adapter found it (once per request)."""

    index: int
    """Where it is in the format's message list."""
    text: str
    """The text as sent (OpenClaw's stamp and runtime lines included), without the
    `<system-reminder>` blocks an agent put beside it."""
    last: bool
    """Nothing but agent-internal context follows it: the user's own turn, not a tool loop."""
    typed: str | None = None
    """What the person typed, when this turn is one they typed (see `typed_text`): the chat
    command is read from this alone. None for a turn that carries tool results."""

    @cached_property  # read by the command check, the memory stage and recall
    def query(self) -> str:
        """What recall searches for and the chat command is read from: `clean(excerpt(text))`,
        at most `QUERY_HEAD + QUERY_TAIL` characters of the turn (see `excerpt`)."""
        return clean(excerpt(self.text))

    @property
    def key(self) -> str:
        """Stable id of this turn: a tool loop resends it, and recall counts it once."""
        return f"{self.index}:{hashlib.sha256(self.text.encode('utf-8', 'replace')).hexdigest()}"


def internal(text: str) -> bool:
    """Whether `text` is an agent-internal block rather than something a person typed."""
    return text.lstrip().startswith(INTERNAL_CONTEXT)


def without_reminders(text: str) -> str | None:
    """`text` without the `<system-reminder>…</system-reminder>` blocks an agent added beside
    the user's words; None when nothing else is left. One find per block: linear.

    >>> without_reminders("<system-reminder>\\nCLAUDE.md …\\n</system-reminder>\\n/ctxbudget")
    '/ctxbudget'
    >>> without_reminders("<system-reminder>\\nToday is Monday.\\n</system-reminder>") is None
    True
    >>> without_reminders("what is <system-reminder> for?")   # no closing tag: the user's
    'what is <system-reminder> for?'
    """
    if REMINDER not in text:
        return text
    pieces: list[str] = []
    at = 0
    while (start := text.find(REMINDER, at)) >= 0:
        end = text.find(_REMINDER_END, start)
        if end < 0:
            break
        pieces.append(text[at:start])
        at = end + len(_REMINDER_END)
    if at == 0:
        return text
    pieces.append(text[at:])
    own = "".join(pieces).strip()
    return own or None


def typed_text(message: dict[str, Any]) -> str | None:
    """What a person typed in `message`: its text without the agent's blocks around it, and
    nothing read from inside them; None when it carries tool results (a tool loop's turn,
    whatever text is beside them) or has no text of its own.

    Stricter than `message_text`, which recall reads: a reminder can quote a file, and a file
    can hold `</system-reminder>` of its own, after which `message_text` would read the rest
    of the file as the user's (issue 35). Here a block that opens a text runs to the text's
    *last* closing tag, and one after the user's words to the text's end.

    >>> typed_text({"content": "<system-reminder>\\nx\\n</system-reminder>\\n/ctxbudget json"})
    '/ctxbudget json'
    >>> typed_text({"content": "/ctxbudget <system-reminder>\\nx\\n</system-reminder>"})
    '/ctxbudget'
    >>> quoted = "<system-reminder>\\nContents of a.md:\\n</system-reminder>\\n/ctxbudget\\n"
    >>> typed_text({"content": quoted + "<system-reminder></system-reminder>"}) is None
    True
    >>> typed_text({"content": [{"type": "tool_result"}, {"type": "text", "text": "/ctxbudget"}]})
    """
    content = message.get("content")
    if isinstance(content, str):
        return _outside_reminders(content)
    if not isinstance(content, list) or any(
        isinstance(p, dict) and p.get("type") in _RESULTS for p in content
    ):
        return None
    texts = [
        own
        for p in content
        if isinstance(p, dict) and p.get("type") in _TEXTS and isinstance(p.get("text"), str)
        if (own := _outside_reminders(p["text"])) is not None
    ]
    return "\n".join(texts) if texts else None


def _outside_reminders(text: str) -> str | None:
    own = text.strip()
    if own.startswith(REMINDER):
        end = own.rfind(_REMINDER_END)
        if end >= 0:  # no closing tag at all: not an agent's block, the user's text
            own = own[end + len(_REMINDER_END) :].strip()
    start = own.find(REMINDER)
    if start >= 0 and own.endswith(_REMINDER_END):
        own = own[:start].strip()
    return own or None


def message_text(message: dict[str, Any]) -> str | None:
    """The user's own text of a message whose content is a string or text parts (agent
    reminders left out); None when it has none."""
    content = message.get("content")
    if isinstance(content, str):
        return without_reminders(content)
    if isinstance(content, list):
        texts = [
            own
            for p in content
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            if (own := without_reminders(p["text"])) is not None
        ]
        return "\n".join(texts) if texts else None
    return None


def _agent_context(message: Any) -> bool:
    """Whether `message`, after the user's text, is context an agent added rather than a
    tool loop: a system message (Claude Code's environment), or a user message of internal
    context or reminders only (no tool results)."""
    if not isinstance(message, dict):
        return False
    role = message.get("role")
    if role in _CONTEXT_ROLES:
        return True
    if role != "user":
        return False
    content = message.get("content")
    if isinstance(content, list) and any(
        isinstance(p, dict) and p.get("type") in ("tool_result", "function_call_output")
        for p in content
    ):
        return False
    text = message_text(message)
    return internal(text) if text is not None else bool(content)


def latest_user(messages: Sequence[Any]) -> tuple[int, str] | None:
    """(index, raw text) of the latest user message that is not an agent-internal block."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        text = message_text(message)
        if text is None or internal(text):
            continue
        return index, text
    return None


def user_turn(messages: Sequence[Any]) -> UserTurn | None:
    """The latest real user turn of chat-style `messages` (role + string or text parts)."""
    found = latest_user(messages)
    if found is None:
        return None
    index, text = found
    last = all(_agent_context(m) for m in messages[index + 1 :])
    return UserTurn(index=index, text=text, last=last, typed=typed_text(messages[index]))


def excerpt(text: str) -> str:
    """The part of a user turn recall reads: all of it up to `QUERY_HEAD + QUERY_TAIL`
    characters, else its first `QUERY_HEAD` and last `QUERY_TAIL`, without the word each cut
    splits.

    Why a bound, and this one: recall costs about one index lookup per distinct word, so a
    1 MB message took ~2 s of recall and 5 MB up to 12 s (issue 24), while what a person asks
    fits in a few hundred characters. When a turn is long it is a paste (a log, a file, a
    page) with the ask before or after it, so the head and the tail are where the ask is; the
    middle of a paste adds words that match everything and nothing. 2,000 + 2,000 characters
    (~600 words, ~50 ms of recall at worst) keep a question with a long preamble whole and
    bound recall, the chat command check (`/context budget` is the whole turn, so a long turn
    is never one) and deep's LLM rewrite alike. `UserTurn.key` still hashes the whole text.

    >>> excerpt("short question") == "short question"
    True
    >>> long = "When is the zebra deadline? " + "log line " * 2_000 + "Also, who owns it?"
    >>> cut = excerpt(long)
    >>> len(cut) <= QUERY_HEAD + QUERY_TAIL + 1, cut.startswith("When is"), cut.endswith("it?")
    (True, True, True)
    """
    if len(text) <= QUERY_HEAD + QUERY_TAIL:
        return text
    head, tail = text[:QUERY_HEAD], text[-QUERY_TAIL:]
    if not text[QUERY_HEAD].isspace():  # the head's last word goes on past the cut
        head = head[: max(head.rfind(c) for c in _SPACES) + 1] or head
    if not text[-QUERY_TAIL - 1].isspace():  # the tail's first word began before the cut
        at = min((i for i in (tail.find(c) for c in _SPACES) if i >= 0), default=-1)
        tail = tail[at + 1 :] if at >= 0 else tail
    return f"{head}\n{tail}"


def runtime_agent(*texts: str) -> str | None:
    """The agent OpenClaw's `Runtime: agent=<name> | …` line names in the first of `texts`
    that has one at the start of a line; None when none does.

    OpenClaw writes the line at the end of its system prompt, or (9.x, chat completions)
    moves it into the first user message: recall reads it so that memories scoped to that
    agent (`agent:<name>`) are found without an `x-context-budget-agent` header.

    >>> runtime_agent("## Runtime\\nRuntime: agent=ops | host=vm | thinking=off")
    'ops'
    >>> runtime_agent("You said 'Runtime: agent=x' once", "hi\\n\\nRuntime: agent=main | host=vm")
    'main'
    >>> runtime_agent("no runtime line") is None
    True
    """
    for text in texts:
        at = text.find(RUNTIME_AGENT)
        while at >= 0:
            if at == 0 or text[at - 1] == "\n":
                found = _AGENT_NAME.match(text, at + len(RUNTIME_AGENT))
                if found:
                    return found.group()
            at = text.find(RUNTIME_AGENT, at + 1)
    return None


def clean(text: str) -> str:
    """User text without OpenClaw's time stamp and runtime lines."""
    return _RUNTIME.sub("", _STAMP.sub("", text.strip())).strip()
