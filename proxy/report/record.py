"""One proxied request as the report keeps it: the typed record, and its JSON entry.

The request path builds a `RequestRecord` and queues it; the writer thread turns it into the
JSON entry (`describe`) that `/context/budget/requests/{id}`, the recent list, the page and
the telemetry sink all read, counting the tokens the request path did not count.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import orjson

from caps import Segment
from proxy.tokens import TokenCounter
from proxy.usage import Usage


@dataclass(frozen=True, kw_only=True)
class RequestRecord:
    """What the proxy did with one request; queued by the pipeline, written by the store."""

    id: str
    ts: float
    """When the request finished (epoch seconds)."""
    model: str | None
    enabled: bool
    """Whether the caps were on for this request."""
    stream: bool
    status: int
    """The status the client got (499: it went away; 502: the upstream broke mid-stream)."""
    duration_ms: float
    segments: tuple[Segment, ...]
    encoding: str
    """tiktoken encoding the saved tokens are counted in."""
    route: str = "openai"
    """`openai` or `anthropic` (the upstream), or the litellm model it was routed to."""
    wire: str = "chat"
    """The wire format the client spoke (`chat`, `messages`, `responses`)."""
    clamp_error: str | None = None
    upstream_error: str | None = None
    segment_tokens: tuple[int, ...] = ()
    """Tokens saved per segment, when the request path already counted them."""
    input_price: float | None = None
    """USD per input token of the request's model (litellm's map); None when unknown."""
    marks: dict[str, int] = field(default_factory=dict)
    """Wall-clock ns of the request's phases (start, parsed, clamped, recall_start, …, end)."""
    response_id: str | None = None
    """The upstream's id for its reply, when its usage said."""
    response_model: str | None = None
    """The model that answered, when the reply's usage event said."""
    memory: dict[str, Any] | None = None
    """What recall did (`RecallReport.to_dict()`), or None when it had nothing to do."""
    worker: int = 0
    """Process id of the worker that served it."""
    owner: str = "default"
    """Whose request it was (the proxy key's owner): each key sees only its own report."""
    note: str | None = None
    """What the wire adapter said about the request as a whole (e.g. a continuation)."""
    usage: Usage | None = None
    """The provider's usage from the reply; None when the reply had none."""


def segment_tokens_saved(tokens: TokenCounter, segment: Segment, encoding: str) -> int:
    """Tokens a clamp saved (or would save) on `segment`: before minus after."""
    if segment.action == "kept" or segment.saved <= 0:
        return 0
    return max(
        0, tokens.count(segment.original, encoding) - tokens.count(segment.clamped, encoding)
    )


def usd(tokens: int, price: float | None) -> float | None:
    """`tokens` of input at `price` USD per token (unrounded: sums stay exact to display)."""
    return None if price is None else tokens * price


def describe(r: RequestRecord, tokens: TokenCounter) -> dict[str, Any]:
    """The report's JSON entry for `r` (counting saved tokens the request path did not)."""
    segments: list[dict[str, Any]] = []
    for i, s in enumerate(r.segments):
        if i < len(r.segment_tokens):
            saved_tokens = r.segment_tokens[i]
        else:
            saved_tokens = segment_tokens_saved(tokens, s, r.encoding)
        segments.append(
            {
                "kind": s.kind,
                "label": s.label,
                "before": s.before,
                "after": s.after,
                "saved": s.saved,
                "savedTokens": saved_tokens,
                "savedUsd": usd(saved_tokens, r.input_price),
                "action": s.action,
                "cap": s.cap,
                "messageIndex": s.message_index,
                "tool": s.tool,
                "callId": s.call_id,
                "url": s.url,
                "note": s.note,
            }
        )
    acted = [s for s in segments if s["action"] == "clamped"]
    would = [s for s in segments if s["action"] == "would-clamp"]
    saved_tokens = sum(s["savedTokens"] for s in acted)
    would_tokens = sum(s["savedTokens"] for s in would)
    return {
        "id": r.id,
        "at": r.ts,
        "model": r.model,
        "route": r.route,
        "wire": r.wire,
        "note": r.note,
        "enabled": r.enabled,
        "stream": r.stream,
        "status": r.status,
        "durationMs": round(r.duration_ms, 3),
        "encoding": r.encoding,
        "memories": (r.memory or {}).get("injected", 0),
        "clampError": r.clamp_error,
        "upstreamError": r.upstream_error,
        "segmentsSeen": len(segments),
        "clamped": len(acted),
        "wouldClamp": len(would),
        "savedChars": sum(s["saved"] for s in acted),
        "savedTokens": saved_tokens,
        "wouldSaveChars": sum(s["saved"] for s in would),
        "wouldSaveTokens": would_tokens,
        "inputPricePerMTok": None if r.input_price is None else round(r.input_price * 1e6, 6),
        "savedUsd": usd(saved_tokens, r.input_price),
        "wouldSaveUsd": usd(would_tokens, r.input_price),
        "segments": segments,
        "worker": r.worker,
        "owner": r.owner,
        "memory": r.memory,
        "usage": r.usage.to_dict() if r.usage is not None else None,
    }


def dumps_entry(body: dict[str, Any]) -> str:
    """A report entry as JSON text. Client strings may hold what orjson refuses (a lone
    surrogate in `model`): the stdlib escapes those, so one such request cannot cost the
    others in its batch their records."""
    try:
        return orjson.dumps(body).decode()
    except TypeError:
        return json.dumps(body)


def loads_entry(text: str | bytes) -> Any:
    """An entry written by `dumps_entry`."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
