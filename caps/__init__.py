"""Find the context-cost segments of a chat request and clamp them to their caps.

Pure functions: no I/O, no configuration files, no clock, no state between calls (what the
clamps remember is the caller's `Memo`).
"""

from ctxbudget.caps._text import utf16_len
from ctxbudget.caps.clamp import clamp_request, prune_request
from ctxbudget.caps.memo import Memo, remembering
from ctxbudget.caps.prune import pays
from ctxbudget.caps.resume import ClampState
from ctxbudget.caps.types import (
    KEEP_WHOLE,
    SEGMENT_KINDS,
    Action,
    Caps,
    ChatRequest,
    Clamp,
    ClampResult,
    Message,
    PrunePolicy,
    Segment,
    SegmentKind,
    Strategy,
    ToolNames,
)

__all__ = [
    "Action",
    "Caps",
    "ChatRequest",
    "Clamp",
    "ClampResult",
    "ClampState",
    "KEEP_WHOLE",
    "Memo",
    "Message",
    "PrunePolicy",
    "SEGMENT_KINDS",
    "Segment",
    "SegmentKind",
    "Strategy",
    "ToolNames",
    "clamp_request",
    "pays",
    "prune_request",
    "remembering",
    "utf16_len",
]
