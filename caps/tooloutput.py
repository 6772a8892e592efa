"""Any other tool's result: head + tail under `contextBudget.toolOutputMaxChars`.

Commands, searches and MCP tools (Claude Code's Bash, Grep, Glob, `mcp__*`; Codex's
exec_command; OpenClaw's exec, process, browser) return whatever they print, and a long test
log or a recursive grep costs its tokens on every later request of the session. A result over
the cap keeps its head and its tail (errors and summaries are often at the end) with a note in
the middle saying how much was cut and how to see it. Never on the tools agents edit from
(`ToolNames.keep_whole`): that is the caller's rule (`caps.toolresults`).

A result that is JSON stays JSON: its long string values are cut instead (each to the same
length, the longest that lets the whole fit), keys, numbers and structure untouched. A JSON
result whose structure alone is over the cap is left whole, and so is one of over
`_json.MAX_STRUCTURE` characters of structure or nested over `_json.MAX_DEPTH` levels,
whatever the cap (its brackets are counted before it is parsed: issue 35). Text in OpenClaw's
`<<<EXTERNAL_UNTRUSTED_CONTENT id=…>>>` wrapper (its network tools) is cut inside the wrapper
only: the markers, their id and the notice stay whole, or the text does.

>>> log = "".join(f"line {i}: ok\\n" for i in range(2000)) + "FAILED: 1 test\\n"
>>> out, note = clamp_output(log, 300)
>>> utf16_len(out), note, out.endswith("FAILED: 1 test\\n"), out.startswith("line 0: ok")
(300, None, True, True)
>>> print(out[out.index("[..."):out.index("result;") + 7])
[...truncated by ctxbudget: kept 91+92 of 26905 chars of this tool result;
>>> clamp_output(out, 300) == (out, None)          # idempotent
True
>>> import json
>>> result = json.dumps({"rows": ["x" * 5000, "y" * 5000], "count": 2})
>>> out, note = clamp_output(result, 400)
>>> data = json.loads(out)
>>> utf16_len(out) <= 400, data["count"], [len(r) < 200 for r in data["rows"]], note
(True, 2, [True, True], None)
>>> numbers = json.dumps(list(range(500)))
>>> clamp_output(numbers, 100) == (numbers, _WHOLE)     # no string to cut: left whole
True
>>> nested = "[" + ",".join(["[" * 200 + "]" * 200] * 2600) + "]"  # 520,201 lists, unparsed
>>> clamp_output(nested, 16000) == (nested, _WHOLE)
True
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from ctxbudget.caps import _json, passages, webfetch
from ctxbudget.caps._cut import MIN_PART, head_tail
from ctxbudget.caps._text import utf16_len

HEAD_SHARE = 0.5
"""What is kept goes half to the head (what ran), half to the tail (how it ended)."""
MIN_STRING = 48
"""A JSON string is never cut below this many units: a marker needs the room."""
_WHOLE = "JSON result whose structure alone is over the cap: left whole"
_WRAPPED = "cap smaller than the untrusted-content markers: left whole"
_BULKY = f"JSON result of over {_json.MAX_STRUCTURE:,} characters of structure: left whole"
_DEEP = f"JSON result nested over {_json.MAX_DEPTH} levels: left whole"


def clamp_output(text: str, cap: int, *, question: str | None = None) -> tuple[str, str | None]:
    """`text` cut to at most `cap` UTF-16 units, and a note when it could not be (the text
    then comes back whole). Deterministic; a result at or under the cap is returned as is.
    With a `question` (the `query` strategy) a text keeps its head, its error lines and
    tracebacks, the passages that answer the question and its last lines (`caps.passages`),
    else head and tail; JSON is cut as before."""
    if utf16_len(text) <= cap:
        return text, None
    limit = min(cap, _json.MAX_STRUCTURE)
    if text.lstrip()[:1] in _JSON_STARTS and _json.bulky(text, limit):
        return text, _WHOLE if limit == cap else _BULKY  # never parsed, never walked
    value = _parse(text)
    if value is _NOT_JSON:
        out = _cut_text(text, cap, question)
        return (text, _WRAPPED) if out is None else (out, None)
    longest = _longest(value)
    if longest is None:
        return text, _DEEP
    out = _clamp_json(text, value, longest, cap)
    return (text, _WHOLE) if out is None else (out, None)


def _cut_text(text: str, cap: int, question: str | None) -> str | None:
    """Head + tail (or the passages for `question`), inside an untrusted-content wrapper when
    `text` has one (None: the wrapper alone is over the cap)."""
    parts = webfetch.split(text)
    if parts is None:
        return _cut_plain(text, cap, question)
    before, page, after = parts
    room = cap - utf16_len(before) - utf16_len(after)
    if room < MIN_PART:
        return None
    return f"{before}{_cut_plain(page, room, question)}{after}"


def _cut_plain(text: str, cap: int, question: str | None) -> str:
    if question is not None:
        out = passages.pick(text, cap, question, how=_HOW, errors=True, tail=True)
        if out is not None:
            return out
    return head_tail(text, cap, _MARKERS, head_share=HEAD_SHARE)


_HOW = "run it again, narrower, for the rest"


_NOT_JSON = object()


def _parse(text: str) -> Any:
    """The JSON value `text` holds, else `_NOT_JSON` (a text that only looks like JSON is cut
    as text: it is not JSON to break). orjson gives up at the first character of a log."""
    if text.lstrip()[:1] not in _JSON_STARTS:
        return _NOT_JSON
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        try:  # lone surrogates and huge integers: valid JSON orjson refuses
            return json.loads(text)
        except (ValueError, RecursionError):
            return _NOT_JSON


_JSON_STARTS = frozenset('{["-0123456789tfn')


def _clamp_json(text: str, value: Any, longest: int, cap: int) -> str | None:
    """`value` written back like `text` with every string value longer than some limit cut
    to it (`longest`: its longest string): the largest limit that fits (a binary search: the
    size grows with the limit)."""
    if longest <= MIN_STRING or not isinstance(value, dict | list | str):
        return None
    # one write with every string at its shortest says whether any limit can fit: a large
    # result of many small values (its structure over the cap) costs one pass, not a search
    smallest = _dump(_cut(value, MIN_STRING), text)
    if smallest is None or utf16_len(smallest) > cap:
        return None
    best = smallest
    low, high = MIN_STRING + 1, longest - 1
    while low <= high:
        limit = (low + high) // 2
        out = _dump(_cut(value, limit), text)
        if out is not None and utf16_len(out) <= cap:
            best, low = out, limit + 1
        else:
            high = limit - 1
    return best


def _dump(value: Any, original: str) -> str | None:
    try:
        return _json.dumps_like(value, original)
    except (RecursionError, ValueError):  # nested too deep, or a number JSON cannot write
        return None


def _longest(value: Any) -> int | None:
    """The longest string value in `value`; None when it nests over `_json.MAX_DEPTH` levels.
    A loop, not recursion: JSON nested 900 deep made the recursive walk raise, and the clamp
    gave up on the whole request. Its values are bounded by `_json.bulky`."""
    longest = 0
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            longest = max(longest, utf16_len(item))
        elif isinstance(item, dict | list):
            if depth >= _json.MAX_DEPTH:
                return None
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return longest


def _cut(value: Any, limit: int) -> Any:
    """`value` with each string value over `limit` units cut to it (keys untouched)."""
    if isinstance(value, str):
        cut = _cut_text(value, limit, None)
        return value if cut is None else cut
    if isinstance(value, dict):
        return {k: _cut(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut(v, limit) for v in value]
    return value


def _marker(head: int, tail: int, size: int) -> str:
    return (
        f"[...truncated by ctxbudget: kept {head}+{tail} of {size} chars of this tool result; "
        "run it again, narrower, for the rest...]"
    )


def _compact(head: int, tail: int, size: int) -> str:
    return f"[…truncated {head}+{tail}/{size}]"


_MARKERS = (_marker, _compact)
