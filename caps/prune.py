"""Pruning: stale tool results out of a long session, once, and the same bytes after that.

An agent re-sends every earlier tool result on every turn. A *prunable* result is

- older than the newest `keep_last_assistants` assistant messages (a result that came after
  the `keep_last_assistants`-th assistant message from the end is never touched),
- at least `min_chars` long (UTF-16 units, as the caps count),
- of a tool the policy allows (`allow` globs, empty = every tool; `deny` wins),
- text: a string, or parts that are all text (images and other parts are never pruned).

A pruned result keeps its message, its `tool_call_id` and its place; only its text changes:

- over `soft_max_chars`: head and tail kept (`head_chars`, `tail_chars`), with a note of the
  tool, the call and the original size (a *soft trim*);
- else, when `hard_clear` is on: the placeholder with the tool, the call and the size, so the
  model can run the tool again (a *hard clear*); when it is off, the result is left alone.

When to prune, and which decisions stand, is the caller's (`proxy/pipeline/prune.py`): this
module finds the prunable results (`prunable`), writes a pruned result's text
(`pruned_text`, deterministic: the same result gives the same bytes), and applies the
decisions it is given (`apply`), each result exactly as decided — a decision once taken is
never taken differently, so the provider's cache sees the same bytes every turn after.

A decision is bound to the result it was taken for by the result's `digest`: a call id alone
does not name a result (local models and some providers number their calls `call_0`, … in
every conversation, and a client may edit its history), so a result with another text under
the same call id is left alone.

>>> policy = PrunePolicy(keep_last_assistants=1, min_chars=100, soft_max_chars=300,
...                      head_chars=10, tail_chars=10)
>>> messages = [
...     {"role": "assistant", "tool_calls": [
...         {"id": "c1", "type": "function", "function": {"name": "exec", "arguments": "{}"}}]},
...     {"role": "tool", "tool_call_id": "c1", "content": "0123456789" * 50},
...     {"role": "assistant", "content": "done"},
... ]
>>> [(c.call_id, c.tool, c.chars) for c in prunable(messages, policy)]
[('c1', 'exec', 500)]
>>> print(pruned_text("0123456789" * 50, "exec", "c1", policy))
0123456789
[…tool result pruned: exec c1, 500 chars, kept 10+10; run the tool again for the rest…]
0123456789
>>> pruned_text("0123456789" * 20, "exec", "c1", policy)
'[Old tool result content cleared] (exec c1, 200 chars: run the tool again if you need it)'
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, count, islice
from operator import is_not
from typing import TYPE_CHECKING, Any

from ctxbudget.caps._text import utf16_head, utf16_len, utf16_tail
from ctxbudget.caps.toolresults import tool_calls
from ctxbudget.caps.types import Action, Caps, Message, PrunePolicy, Segment

if TYPE_CHECKING:
    from ctxbudget.caps.memo import Memo


@dataclass(frozen=True, kw_only=True)
class Prunable:
    """A result that may be pruned."""

    call_id: str
    tool: str | None
    message_index: int
    chars: int
    """Its text's length, UTF-16 units."""
    text: str


def prunable(
    messages: Sequence[Any], policy: PrunePolicy, memo: Memo | None = None
) -> list[Prunable]:
    """The prunable results of chat-shaped `messages`, oldest first (`memo`: where the calls
    read are remembered, `caps.Memo`)."""
    cutoff = _cutoff(messages, policy.keep_last_assistants)
    if cutoff <= 0:
        return []
    names = _names(messages[:cutoff], memo)
    found = []
    for index in range(cutoff):
        message = messages[index]
        if not isinstance(message, dict) or message.get("role") != "tool":
            continue
        call_id = message.get("tool_call_id")
        text = _text(message.get("content"))
        if not isinstance(call_id, str) or text is None:
            continue
        chars = utf16_len(text)
        tool = names.get(call_id)
        if chars >= policy.min_chars and policy.allows(tool):
            found.append(Prunable(call_id=call_id, tool=tool, message_index=index, chars=chars,
                                  text=text))  # fmt: skip
    return found


def digest(text: str) -> str:
    """The digest a decision on the result `text` is bound to (32 hex digits): the same in
    every process and instance, as decisions are shared through a database; BLAKE2b, as the
    ids kept there are (`proxy/cache/blocks.py` `shared_digest`), so no client can make
    two results digest alike. ~10 µs for an 8 KB result: the callers keep it with the
    result's segment.

    >>> digest("ok")
    'c3fc4b4165fd8bb754adc15660fefcdd'
    >>> digest("a\\ud800") == digest("a\\ud800") != digest("a")  # a lone surrogate digests too
    True
    """
    data = text.encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def pruned_text(text: str, tool: str | None, call_id: str, policy: PrunePolicy) -> str | None:
    """What a pruned result says instead of `text`; None when the policy leaves it alone
    (not over `soft_max_chars` and `hard_clear` off). Never longer than `text`."""
    size = utf16_len(text)
    name = f"{tool or 'tool'} {call_id}"
    if size > policy.soft_max_chars:
        head = utf16_head(text, policy.head_chars)
        tail = utf16_tail(text, policy.tail_chars)
        note = (
            f"[…tool result pruned: {name}, {size:,} chars, kept "
            f"{utf16_len(head)}+{utf16_len(tail)}; run the tool again for the rest…]"
        )
        out = f"{head}\n{note}\n{tail}"
        if utf16_len(out) < size:
            return out
    if not policy.hard_clear:
        return None
    out = f"{policy.placeholder} ({name}, {size:,} chars: run the tool again if you need it)"
    return out if utf16_len(out) < size else None


def apply(
    messages: list[Message],
    decisions: Mapping[tuple[str, str], str | None],
    *,
    fresh: frozenset[tuple[str, str]] = frozenset(),
    policy: PrunePolicy | None = None,
    digest_of: Callable[[str, str | None, str], str] | None = None,
    memo: Memo | None = None,
) -> tuple[list[Message], list[Segment]]:
    """`messages` with each result that has a decision replaced by its text (a string
    content; parts that were all text become that string); the same list when no decision
    applies. `decisions`: (call id, `digest` of the result it was taken for) → the text that
    stands for it; a result whose call id has a decision but whose text has another digest
    is left alone. A decision without its text (None) is `pruned_text` of the result by
    `policy` (left alone when that is None). `fresh`: the decisions taken for this request
    (the segments say `pruned now`; the others `pruned earlier`). `digest_of(text, tool,
    call id)`: the result's digest, when the caller keeps it (else `digest`)."""
    if not decisions:
        return messages, []
    find = digest_of or (lambda text, tool, call_id: digest(text))
    decided = {call_id for call_id, _ in decisions}
    names = _names(messages, memo)
    out: list[Message] | None = None
    segments: list[Segment] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") != "tool":
            continue
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or call_id not in decided:
            continue
        text = _text(message.get("content"))
        if text is None:
            continue
        tool = names.get(call_id)
        key = (call_id, find(text, tool, call_id))
        if key not in decisions:
            continue  # a decision taken for another result under this call id
        new = decisions[key]
        if new is None and policy is not None:
            new = pruned_text(text, tool, call_id, policy)
        if new is None:
            continue
        note = "pruned now" if key in fresh else "pruned earlier"
        segments.append(
            segment(
                text,
                new,
                tool,
                call_id,
                action="clamped",
                message_index=index,
                note=note,
                digest=key[1],
            )  # fmt: skip
        )
        if text == new:
            continue
        out = out if out is not None else list(messages)
        out[index] = {**message, "content": new}
    return (out if out is not None else messages), segments


@dataclass(frozen=True, slots=True)
class Applied:
    """What applying one request's decisions did to its list (`apply`, through the caller's
    view of it), carried to the next request of the conversation: a decision once applied
    gives the same bytes every turn after, so the items that request repeats (the very
    objects) come out as they did, and only its new ones are looked at (`carry`). Never
    changed once made: the lists are the request's own, shared and never written to."""

    key: Hashable
    """The decisions and the policy applied (`applied_key`)."""
    decided: frozenset[str]
    """The call ids the decisions were taken for."""
    items: list[Any]
    """The list as it came to the pass."""
    out: list[Any]
    """The list as the pass left it (`items` itself when nothing changed)."""
    segments: tuple[Segment, ...]
    """The `pruned` segments, in the list's order."""
    at: tuple[int, ...]
    """Each segment's item (its `message_index`)."""
    changed_from: int
    """The first item `out` holds another object for (`len(items)` when none: `out` is
    `items`)."""


def applied_key(caps: Caps) -> Hashable:
    """What the outcome of applying `caps.pruned` depends on besides the items: the decisions
    (in any order), the ones taken now (their note) and the policy (a decision without its
    text is the policy's)."""
    return (frozenset(caps.pruned), caps.pruned_now, caps.prune)


def applied(caps: Caps, items: list[Any], out: list[Any], segments: Sequence[Segment]) -> Applied:
    """`Applied` for the pass of `caps` over `items` that gave `out` and `segments`."""
    return Applied(
        applied_key(caps),
        frozenset(call_id for call_id, _, _ in caps.pruned),
        items,
        out,
        tuple(segments),
        tuple(s.message_index for s in segments),
        len(items) if out is items else _same(out, items),
    )


def carry(
    items: list[Any],
    caps: Caps,
    last: Applied | None,
    ids: Callable[[Any], Iterable[str]],
) -> Applied | None:
    """What applying `caps.pruned` to `items` gives (`out`, `segments`), carried from `last`
    (the pass over the conversation's last request) for the items `items` repeats; None when
    it cannot be (other decisions or policy, nothing repeated, a call or result of a decided
    call id among the items added or dropped since: then it is worked whole). Its `out` is
    `items` itself when the pass changes none of them, as the whole pass gives it. `ids(item)`:
    the call ids of an item's calls and results (the format's own).

    What a decision does to a result depends on the result and its call id's tool name
    (the calls of the whole list): the items repeated are the same objects, and a new or a
    dropped item that names none of the decided call ids changes no name they read and has
    nothing to apply: it goes as it came. Only the new items are looked at, and the first
    ones found the same by a C scan (no Python per item)."""
    if last is None or last.key != applied_key(caps):
        return None
    k = _same(items, last.items)
    if k == 0:
        return None
    decided = last.decided
    for item in (*items[k:], *last.items[k:]):
        if not decided.isdisjoint(ids(item)):
            return None
    kept = bisect_left(last.at, k)
    if last.changed_from >= k:  # nothing it repeats was changed: the list goes as it came
        out, changed_from = items, len(items)
    else:
        out, changed_from = [*last.out[:k], *items[k:]], last.changed_from
    return Applied(
        last.key, decided, items, out, last.segments[:kept], last.at[:kept], changed_from
    )


def _same(new: Sequence[Any], old: Sequence[Any]) -> int:
    """How many first items of `new` are the very objects of `old` (a C scan, ~20 ns an
    item)."""
    limit = min(len(new), len(old))
    return next(compress(count(), islice(map(is_not, new, old), limit)), limit)


def segment(
    text: str,
    new: str,
    tool: str | None,
    call_id: str,
    *,
    action: Action,
    chars: int | None = None,
    message_index: int = -1,
    note: str | None = None,
    digest: str | None = None,
) -> Segment:
    """The `pruned` segment of a result whose `text` `new` stands for (`chars`: the text's
    UTF-16 length, when known; `digest`: the text's, when known)."""
    return Segment(
        kind="pruned",
        label=f"{tool or 'tool'} {call_id}",
        before=utf16_len(text) if chars is None else chars,
        after=utf16_len(new),
        action=action,
        cap=None,
        message_index=message_index,
        tool=tool,
        call_id=call_id,
        note=note,
        original=text,
        clamped=new,
        digest=digest,
    )


def pays(saved: int, rewritten: int, *, write: float, read: float, expected: float) -> bool:
    """Whether pruning in a warm session costs less than it saves (`docs/pruning.md`).

    `saved`: tokens the prune removes; `rewritten`: tokens of the cached prefix from the first
    pruned result to its end, which this request then writes instead of reading; `write`,
    `read`: what a cached token costs to write and to read (USD, or in input prices);
    `expected`: later requests expected to read the pruned prefix before the cache expires.

    Without the prune the next requests read `rewritten` tokens each; with it this request
    writes `rewritten - saved` tokens instead of reading `rewritten`, and every later request
    reads `saved` fewer. So it pays when
    `expected × saved × read > (rewritten − saved) × write − rewritten × read`.

    >>> pays(10_000, 50_000, write=3.75, read=0.3, expected=10)   # Anthropic 5m, $/MTok
    False
    >>> pays(10_000, 50_000, write=3.75, read=0.3, expected=50)
    True
    """
    if saved <= 0:
        return False
    cost = (rewritten - saved) * write - rewritten * read
    return expected * saved * read > cost


def _cutoff(messages: Sequence[Any], keep: int) -> int:
    """The index of the `keep`-th assistant message from the end (results before it may be
    pruned); 0 when there are not that many."""
    if keep <= 0:
        return len(messages)
    seen = 0
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, dict) and message.get("role") == "assistant":
            seen += 1
            if seen == keep:
                return index
    return 0


def _names(messages: Sequence[Any], memo: Memo | None) -> dict[str, str]:
    """Call id → tool name, from the assistant messages' `tool_calls`."""
    return {call_id: name for call_id, (name, _) in tool_calls(list(messages), memo).items()}


def _text(content: Any) -> str | None:
    """A result's text: a string, or the parts' texts joined when every part is text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = [
            p.get("text")
            for p in content
            if isinstance(p, dict) and p.get("type") in (None, "text", "input_text", "output_text")
        ]
        if len(texts) == len(content) and all(isinstance(t, str) for t in texts):
            return "\n".join(texts)  # type: ignore[arg-type]
    return None
