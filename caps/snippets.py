"""Memory tool results: `memory_search` snippets and `memory_get` text.

`memory_search` — the cap is a total across `results[].snippet`, citation suffix
(`\\n\\nSource: path#L…`) included, spent in rank order the way OpenClaw's own
`clampResultsByInjectedChars` does: whole snippets while they fit, then one snippet cut (here
with a marker, which counts toward the cap), then the rest dropped and counted.

>>> payload = {"results": [{"snippet": "a" * 50}, {"snippet": "b" * 50}, {"snippet": "c"}]}
>>> out, before, after, dropped = clamp_search(payload, 80)
>>> [r["snippet"][-16:] for r in out["results"]], before, after, dropped
([\'aaaaaaaaaaaaaaaa\', \'bbb\\n[…truncated]\'], 101, 80, 1)
>>> clamp_search(out, 80)[0] is out          # idempotent: a clamped result is kept as it is
True

`memory_get` — the cap applies to `text`; a cut ends with OpenClaw's own notice, which counts
toward the cap, and sets `truncated` and `nextFrom` so the agent can read on.

>>> got, before, after = clamp_get({"text": "line\\n" * 40, "path": "MEMORY.md"}, 70)
>>> print(got["text"]), got["truncated"], got["nextFrom"], after
line
line
line
<BLANKLINE>
[More content available. Use from=4 to continue.]
(None, True, 4, 65)
"""

from __future__ import annotations

from typing import Any

from ctxbudget.caps._text import utf16_head, utf16_len

SNIPPET_MARKER = "\n[…truncated]"
_MIN_CUT = 16
"""A snippet cut to fewer units than this (plus its marker) is dropped instead."""


def search_size(payload: dict[str, Any]) -> int | None:
    """Total UTF-16 length of the snippets, or None when `payload` is not a search result."""
    results = payload.get("results")
    if not isinstance(results, list):
        return None
    total = 0
    for r in results:
        if not isinstance(r, dict) or not isinstance(r.get("snippet"), str):
            return None
        total += utf16_len(r["snippet"])
    return total


def clamp_search(payload: dict[str, Any], cap: int) -> tuple[dict[str, Any], int, int, int]:
    """(payload, size before, size after, results dropped); the same payload when it fits."""
    before = search_size(payload)
    if before is None or before <= cap:
        size = before or 0
        return payload, size, size, 0
    kept: list[Any] = []
    remaining = cap
    results = payload["results"]
    for i, result in enumerate(results):
        size = utf16_len(result["snippet"])
        if size <= remaining:
            kept.append(result)
            remaining -= size
            continue
        room = remaining - utf16_len(SNIPPET_MARKER)
        if room >= _MIN_CUT:
            kept.append({**result, "snippet": utf16_head(result["snippet"], room) + SNIPPET_MARKER})
            i += 1
        dropped = len(results) - i
        break
    after = sum(utf16_len(r["snippet"]) for r in kept)
    return {**payload, "results": kept}, before, after, dropped


def clamp_get(payload: dict[str, Any], cap: int) -> tuple[dict[str, Any], int, int]:
    """(payload, size before, size after) for a `memory_get` result; the same payload if it fits."""
    text = payload.get("text")
    if not isinstance(text, str):
        return payload, 0, 0
    before = utf16_len(text)
    if before <= cap:
        return payload, before, before
    given = payload.get("from")
    first = given if isinstance(given, int) and not isinstance(given, bool) else 1
    notice = "\n\n[More content available. Use from={} to continue.]"
    # Size the notice for the largest line number it could name.
    room = cap - utf16_len(notice.format(first + text.count("\n") + 1))
    if room < 0:
        cut = utf16_head(text, cap)
        return {**payload, "text": cut, "truncated": True}, before, utf16_len(cut)
    head = utf16_head(text, room)
    # Stop at a line end when there is one, so `nextFrom` names a whole line.
    newline = head.rfind("\n")
    cut = head[: newline + 1] if newline > 0 else head
    next_from = first + cut.count("\n")
    out = cut.rstrip("\n") + notice.format(next_from)
    if utf16_len(out) > cap:
        out = utf16_head(out, cap)
    result = {**payload, "text": out, "truncated": True, "nextFrom": next_from}
    return result, before, utf16_len(out)
