"""Named types shared by the clamps and their callers.

A *segment* is one piece of a chat request that a cap applies to: one bootstrap file (in the
system prompt, or an agent's instruction file in its first user message), one memory tool
result, one web page (a web_fetch result, or the page in Claude Code's WebFetch summariser
request), or one result of any other tool over its cap. Every length here is in
UTF-16 code units, the unit OpenClaw's own limits use (JavaScript string length); see
`caps._text`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Message = dict[str, Any]
ChatRequest = dict[str, Any]

SegmentKind = Literal["bootstrap", "memory", "web_fetch", "tool_output"]
"""The context-cost drivers a cap applies to."""

Action = Literal["clamped", "kept", "would-clamp"]
"""What happened to a segment. `would-clamp` is set by the caller when the budget is off."""

SEGMENT_KINDS: tuple[SegmentKind, ...] = ("bootstrap", "memory", "web_fetch", "tool_output")

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
    original: str = field(default="", repr=False, compare=False)
    """The text measured by `before` (kept for token counting; never logged)."""
    clamped: str = field(default="", repr=False, compare=False)
    """The text measured by `after`."""

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


class Clamp(Protocol):
    """What `clamp_request` is: the one way callers reach the clamps (and a test's stand-in)."""

    def __call__(
        self, request: ChatRequest, caps: Caps, *, tools: ToolNames | None = None
    ) -> ClampResult: ...
