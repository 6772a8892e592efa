"""The `/context budget` chat command: recognised in a user turn, answered by the proxy.

`/context budget` (or `/ctxbudget`) answers a chat-sized summary, `… full` the whole text
report, `… full <section>` one section of it (`TEXT_SECTIONS`: caps, money, kinds, requests,
memory), `… json` the JSON.

Format-neutral: a wire adapter finds the turn (`UserTurn`) and shapes the answer. The command
is the whole of the latest *real* user text — OpenClaw 9.x ends every request with an
internal-context message, stamps user text with `[Sun 2026-11-22 11:28 UTC]` and appends its
`Runtime:` line, all of which `UserTurn.query` leaves out — and only in the user's own turn,
not in a tool loop that follows it.

>>> from memory.query import UserTurn
>>> find_command(UserTurn(index=0, text="[Sun 2026-11-22 11:28 UTC] /context budget", last=True))
'summary'
>>> find_command(UserTurn(index=0, text="/ctxbudget full", last=True))
'full'
>>> find_command(UserTurn(index=0, text="/ctxbudget json", last=True))
'json'
>>> find_command(UserTurn(index=0, text="/context budget please", last=True)) is None
True
>>> caps = UserTurn(index=0, text="/context budget full caps", last=True)
>>> find_command(caps), full_section(caps)
('full', 'caps')
"""

from __future__ import annotations

from typing import Literal

from memory.query import UserTurn

CommandMode = Literal["summary", "full", "json"]
_NAMES = (["/context", "budget"], ["/ctxbudget"])
_MODES: tuple[CommandMode, ...] = ("full", "json")


def find_command(turn: UserTurn | None) -> CommandMode | None:
    """`"summary"`, `"full"` or `"json"` when the user's own latest turn is
    `/context budget [full|json]` (or `/ctxbudget [full|json]`)."""
    if turn is None or not turn.last:
        return None
    if "/context" not in turn.text and "/ctxbudget" not in turn.text:
        return None  # not one: without reading the turn as recall does (~8 µs a request)
    words = turn.query.split()
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
