"""Named types shared by the clamps and their callers.

A *segment* is one piece of a chat request that a cap applies to: one bootstrap file (in the
system prompt, or an agent's instruction file in its first user message), one memory tool
result, one web page (a web_fetch result, or the page in Claude Code's WebFetch summariser
request), or one result of any other tool over its cap. Every length here is in
UTF-16 code units, the unit OpenClaw's own limits use (JavaScript string length); see
`caps._text`.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

if TYPE_CHECKING:
    from ctxbudget.caps.memo import Memo
    from ctxbudget.caps.resume import ClampState

_D = TypeVar("_D")

Message = dict[str, Any]
ChatRequest = dict[str, Any]

SegmentKind = Literal["bootstrap", "memory", "web_fetch", "tool_output", "pruned"]
"""The context-cost drivers a cap applies to, and the stale tool results pruning takes."""

Strategy = Literal["query", "head"]
"""How a web-fetch or tool-output result over its cap is cut: `query` keeps its head and the
passages that answer the question that led to the call (`caps.passages`); `head` its head
(and tail, for tool output) only."""

Action = Literal["clamped", "kept", "would-clamp", "prunable"]
"""What happened to a segment. `would-clamp` is set by the caller when the budget is off;
`prunable` is a tool result pruning could take (`caps/prune.py`), for the caller to decide."""

SEGMENT_KINDS: tuple[SegmentKind, ...] = (
    "bootstrap",
    "memory",
    "web_fetch",
    "tool_output",
    "pruned",
)

KEEP_WHOLE: frozenset[str] = frozenset(
    {
        "Read",
        "read",
        "read_file",
        "view",
        "Edit",
        "Write",
        "MultiEdit",
        "NotebookEdit",
        "edit",
        "write",
        "apply_patch",
    }
)
"""Tools whose results the tool-output cap never cuts (`contextBudget.toolNames.keepWhole`'s
default): agents edit from exactly what they read, and edit results are small."""


PLACEHOLDER = "[Old tool result content cleared]"
"""OpenClaw's own `hardClear.placeholder`."""


def _hash_once(self: Any) -> int:
    """The fields' hash (as the dataclass's own), made once: the clamps' caches key on the
    caps and tool names at every lookup, a dozen a request, and hashing `Caps` walked its
    policy and its pruning plan each time. Kept on the instance (`evolve` drops it)."""
    found: int | None = self.__dict__.get("_hash")
    if found is None:
        found = hash(tuple(getattr(self, f.name) for f in fields(self) if f.compare))
        object.__setattr__(self, "_hash", found)
    return found


def _state(self: Any) -> dict[str, Any]:
    """What a pickle or a copy carries: the fields, not `_hash_once`'s (another process, the
    offload worker, hashes strings with a seed of its own)."""
    return {k: v for k, v in self.__dict__.items() if k != "_hash"}


@dataclass(frozen=True, kw_only=True)
class PrunePolicy:
    """What may be pruned and how (`agents.defaults.contextPruning`, OpenClaw's keys)."""

    keep_last_assistants: int = 3
    """Results after the newest this many assistant messages are never pruned."""
    min_chars: int = 4000
    """Shorter results are left alone (`minPrunableToolChars`)."""
    soft_max_chars: int = 4000
    """Longer results keep head and tail (`softTrim.maxChars`)."""
    head_chars: int = 1500
    """What a soft trim keeps of the start (`softTrim.headChars`)."""
    tail_chars: int = 1500
    """What a soft trim keeps of the end (`softTrim.tailChars`)."""
    hard_clear: bool = True
    """Results a soft trim does not take are cleared (`hardClear.enabled`)."""
    placeholder: str = PLACEHOLDER
    """What stands for a cleared result (`hardClear.placeholder`)."""
    allow: tuple[str, ...] = ()
    """Tool name globs that may be pruned; empty: every tool (`tools.allow`)."""
    deny: tuple[str, ...] = ()
    """Tool name globs never pruned; deny wins (`tools.deny`)."""

    __hash__ = _hash_once
    __getstate__ = _state

    def allows(self, tool: str | None) -> bool:
        """Whether results of `tool` may be pruned (an unnamed tool: only with no allow)."""
        name = tool or ""
        if any(fnmatch.fnmatchcase(name, glob) for glob in self.deny):
            return False
        return not self.allow or any(fnmatch.fnmatchcase(name, glob) for glob in self.allow)


@dataclass(frozen=True, kw_only=True)
class Caps:
    """Effective char caps, one per kind. `None` means "no limit" for that kind."""

    bootstrap_max_chars: int | None = None
    """Per bootstrap file: the body after its `## <path>` line, truncation marker included."""

    memory_max_chars: int | None = None
    """Per memory result: sum of `results[].snippet` (memory_search), or `text` (memory_get)."""

    web_fetch_max_chars: int | None = None
    """Per web_fetch result: its whole `text` field, wrapper and notice included."""

    tool_output_max_chars: int | None = None
    """Per result of any other tool (not `ToolNames.keep_whole`): its text, marker included."""

    strategy: Strategy = "head"
    """How web-fetch and tool-output results over their cap are cut (`Strategy`;
    `contextBudget.clampStrategy`)."""

    prune: PrunePolicy | None = None
    """What pruning may take (`contextPruning`); None: it is off. With a policy the clamp
    reports the prunable results (action `prunable`); `prune_request` applies `pruned`."""

    pruned: tuple[tuple[str, str, str | None], ...] = ()
    """Decisions to apply: (call id, `caps.prune.digest` of the result it was taken for, the
    text that stands for that result; None: write it by `prune`), in a request's second pass
    (`prune_request`). A result whose text has another digest is left alone."""

    pruned_now: frozenset[tuple[str, str]] = frozenset()
    """Of `pruned`, the (call id, digest) decided for this request (the rest were decided
    before)."""

    owner: str = ""
    """Whose request is clamped. The clamps are pure functions of their arguments, and what
    they remember of one (`caps._kept`) is found by this too: a request of another owner with
    the same text never finds what this owner's made, so it cannot time whether it was sent."""

    __hash__ = _hash_once
    __getstate__ = _state


@dataclass(frozen=True, kw_only=True)
class ToolNames:
    """Which tool names count as which kind, so agents other than OpenClaw work too."""

    web_fetch: frozenset[str] = frozenset({"web_fetch"})
    """Tools whose results are web pages wrapped as OpenClaw's web_fetch JSON."""

    memory_search: frozenset[str] = frozenset({"memory_search"})
    """Tools whose results are `{"results": [{"snippet": ...}, ...]}`."""

    memory_get: frozenset[str] = frozenset({"memory_get"})
    """Tools whose results are `{"text": ..., "path": ...}`."""

    keep_whole: frozenset[str] = KEEP_WHOLE
    """Tools whose results the tool-output cap never cuts."""

    __hash__ = _hash_once
    __getstate__ = _state


def evolve(record: _D, **changes: Any) -> _D:
    """`dataclasses.replace(record, **changes)` without running `__init__` again: for the
    frozen records the request path copies per segment and per request (`Segment`,
    `RequestRecord`), which have no `__post_init__` and no slots. ~0.7 µs where `replace`
    takes ~6 µs (a Segment; ~15 µs a RequestRecord of 40 fields).

    >>> from dataclasses import replace
    >>> s = Segment(kind="memory", label="m", before=9, after=4, action="clamped", cap=4)
    >>> evolve(s, message_index=3) == replace(s, message_index=3)
    True
    >>> evolve(s, index=3)
    Traceback (most recent call last):
    TypeError: Segment has no field 'index'
    >>> s.message_index  # the original is unchanged
    -1
    """
    new = object.__new__(type(record))
    values = new.__dict__
    values.update(record.__dict__)
    values.pop("_hash", None)  # `_hash_once`'s, of the fields before the changes
    for name in changes:
        if name not in values:
            raise TypeError(f"{type(record).__name__} has no field {name!r}")
    values.update(changes)
    return new


@dataclass(frozen=True, kw_only=True)
class Segment:
    """One capped piece of a request and what the clamp did to it."""

    kind: SegmentKind
    label: str
    """Human label: the file path, `<tool> <call id>`, or the URL fetched."""
    before: int
    """Length before clamping, UTF-16 code units."""
    after: int
    """Length after clamping (equal to `before` when kept), UTF-16 code units."""
    action: Action
    cap: int | None
    """The cap that applied, UTF-16 code units; `None` when the kind has no cap."""
    message_index: int = -1
    """Index into `messages` of the message holding the segment."""
    tool: str | None = None
    """Tool name for tool results (the real name, after unwrapping a tool-search bridge)."""
    call_id: str | None = None
    """`tool_call_id` for tool results."""
    url: str | None = None
    """Fetched URL for web_fetch results, when known."""
    note: str | None = None
    """What else happened: dropped results, already truncated upstream, unparseable JSON."""
    strategy: Strategy | None = None
    """How a clamped web-fetch or tool-output result was cut: `query` when passages were
    picked for the question, `head` when its head (and tail) were kept; None otherwise."""
    original: str = field(default="", repr=False, compare=False)
    """The text measured by `before` (kept for token counting; never logged)."""
    clamped: str = field(default="", repr=False, compare=False)
    """The text measured by `after`."""
    digest: str | None = None
    """Of a `prunable` or `pruned` segment: `caps.prune.digest` of the result's text, which a
    pruning decision is bound to."""

    @property
    def saved(self) -> int:
        """UTF-16 code units removed (what `would-clamp` would remove)."""
        return self.before - self.after


@dataclass(frozen=True, kw_only=True)
class ClampResult:
    """The clamped request and what changed. The input request is never mutated."""

    request: ChatRequest
    segments: tuple[Segment, ...]
    changed: bool
    """True when `request` differs from the input."""
    state: ClampState | None = None
    """What was decided for each message, to resume from when the next request of the
    conversation repeats them (`clamp_request(..., resume=)`); None: nothing to resume."""


class Clamp(Protocol):
    """What `clamp_request` is: the one way callers reach the clamps (and a test's stand-in).
    `memo`: where what it made is remembered between calls (`caps.Memo`, the caller's); None,
    nowhere."""

    def __call__(
        self,
        request: ChatRequest,
        caps: Caps,
        *,
        tools: ToolNames | None = None,
        memo: Memo | None = None,
        resume: ClampState | None = None,
    ) -> ClampResult: ...
