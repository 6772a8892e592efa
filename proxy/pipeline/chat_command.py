"""The `/context budget` chat command: recognised in a user turn, answered by the proxy.

`/context budget` (or `/ctxbudget`) answers a chat-sized summary, `… full` the whole text
report, `… full <section>` one section of it (`TEXT_SECTIONS`: caps, money, kinds, requests,
memory), `… json` the JSON.

Format-neutral: a wire adapter finds the turn (`UserTurn`) and shapes the answer. The command
is the whole of what the user typed in the newest turn (`UserTurn.typed`) — OpenClaw 9.x ends
every request with an internal-context message, stamps user text with `[Sun 2026-11-22 11:28
UTC]` and appends its `Runtime:` line, Claude Code puts `<system-reminder>` blocks beside it,
all of which are left out — and only in the user's own turn, not in a tool loop that follows
it. Never from text the user did not type (issue 35): not from inside a reminder (a quoted
file), nor from a turn of tool results, nor with words apart by anything but what a keyboard's
space bar, tab or enter types (`/context\\u00a0budget` is someone's paste, not the command).

>>> from memory.query import UserTurn
>>> def typed(text):
...     return UserTurn(index=0, text=text, last=True, typed=text)
>>> find_command(typed("[Sun 2026-11-22 11:28 UTC] /context budget"))
'summary'
>>> find_command(typed("/ctxbudget full"))
'full'
>>> find_command(typed("/ctxbudget json"))
'json'
>>> find_command(typed("/context budget please")) is None
True
>>> find_command(typed("/context\\u00a0budget")) is None
True
>>> find_command(UserTurn(index=0, text="/ctxbudget", last=True, typed=None)) is None
True
>>> caps = UserTurn(index=0, text="/context budget full caps", last=True)
>>> find_command(caps), full_section(caps)
('full', 'caps')
"""

from __future__ import annotations

import re
from typing import Literal

from memory.query import UserTurn, clean, excerpt

CommandMode = Literal["summary", "full", "json"]
_NAMES = (["/context", "budget"], ["/ctxbudget"])
_MODES: tuple[CommandMode, ...] = ("full", "json")
_TYPED_SPACE = re.compile(r"[ \t\r\n]+")


def find_command(turn: UserTurn | None) -> CommandMode | None:
    """`"summary"`, `"full"` or `"json"` when the user's own latest turn is
    `/context budget [full|json]` (or `/ctxbudget [full|json]`)."""
    if turn is None or not turn.last or turn.typed is None:
        return None
    if "/context" not in turn.typed and "/ctxbudget" not in turn.typed:
        return None  # not one: without reading the turn as recall does (~8 µs a request)
    words = _TYPED_SPACE.split(clean(excerpt(turn.typed)).strip(" \t\r\n"))
    for name in _NAMES:
        if words == name:
            return "summary"
        for mode in _MODES:
            if words == [*name, mode]:
                return mode
        if len(words) == len(name) + 2 and words[:-1] == [*name, "full"]:
            return "full"  # one section (`full_section`), or a reply naming them
    return None


def full_section(turn: UserTurn) -> str | None:
    """The word after `full` in a command `find_command` found (`/context budget full caps`:
    `"caps"`, maybe no section of `TEXT_SECTIONS`), or None for the whole text."""
    words = turn.query.split()
    return words[-1].lower() if len(words) >= 3 and words[-2] == "full" else None
