"""Pruning's second pass over a conversation's list, carried from its last request.

Once a prune has acted, every later request of the conversation has its decisions applied
again (`caps.prune_request`, `proxy/pipeline/prune.py`): a pruned result goes out as the same
bytes for the rest of the conversation. Worked whole, that pass is O(history) a request (the
list walked, a Messages request's whole chat view made again). A decision applied once gives
the same result every turn after, so the pass is carried (`caps.prune.carry`): the items a
request repeats come out as they did in its conversation's last request, and only the new
ones are looked at. `CTXBUDGET_CHECK_RESENT=1` works each carried pass whole too and fails
on a difference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ctxbudget.caps import Caps, Segment
from ctxbudget.caps import prune as caps_prune
from ctxbudget.caps._kept import ChangedInPlace
from ctxbudget.proxy.cache.resent import RESENT
from ctxbudget.proxy.wire.body import JsonBody

APPLIED_BYTES_AN_ITEM = 16
"""What a carried pass holds per item beyond the items themselves: its two lists' pointers."""


def second_pass(
    body: JsonBody,
    key: str,
    items: list[Any],
    caps: Caps,
    whole: Callable[[], tuple[list[Any], list[Segment]]],
    ids: Callable[[Any], Iterable[str]],
) -> tuple[list[Any], list[Segment]]:
    """The list `items` (`body`'s list `key` as the clamp left it) with `caps.pruned` applied,
    and the segments: carried from the conversation's last request where it can be, else
    `whole()` (the format's pass over the whole list). `ids(item)`: the call ids an item's
    calls and results name."""
    found = body.extended(key)
    last = found[0].pruned if found is not None else None
    carried = caps_prune.carry(
        items, caps, last if isinstance(last, caps_prune.Applied) else None, ids
    )
    if carried is None:
        out, segments = whole()
        made = caps_prune.applied(caps, items, out, segments)
    else:
        made = carried
        out, segments = carried.out, list(carried.segments)
        if RESENT.check:  # what was carried must be what the whole pass gives
            again = whole()
            if again[0] != out or (again[0] is items) != (out is items) or again[1] != segments:
                raise ChangedInPlace("a conversation's prune carried to another result")
    conversation = body.conversation
    if conversation is not None:
        conversation.pruned = made
        if body.conversations is not None:
            new = 0 if carried is not None else sum(len(s.clamped or "") for s in segments)
            body.conversations.grew(
                body.owner, conversation, APPLIED_BYTES_AN_ITEM * len(out) + 2 * new
            )
    return out, segments


def chat_ids(message: Any) -> Sequence[str]:
    """The call ids a chat message's calls (`tool_calls`) or result (`tool_call_id`) name."""
    if not isinstance(message, dict):
        return ()
    found = message.get("tool_call_id")
    calls = message.get("tool_calls")
    ids = [found] if isinstance(found, str) else []
    if isinstance(calls, list):
        ids += [c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str)]
    return ids


def messages_ids(message: Any) -> Sequence[str]:
    """The call ids a Messages item's `tool_use` and `tool_result` blocks name."""
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return ()
    ids = []
    for part in content:
        if isinstance(part, dict):
            found = part.get("id") if part.get("type") == "tool_use" else part.get("tool_use_id")
            if isinstance(found, str):
                ids.append(found)
    return ids
