"""Independent checks of what the upstream received.

Written from OPENCLAW_WIRE.md, not from `caps`: the end-to-end tests must not grade the clamps
with the clamps' own code.
"""

from __future__ import annotations

import json
import re
from typing import Any

_NAMES = "AGENTS|SOUL|TOOLS|IDENTITY|USER|HEARTBEAT|BOOTSTRAP|MEMORY|memory"
BOOTSTRAP_HEADING = re.compile(rf"^## (?:/|[A-Za-z]:\\|\./)?[^\n]*?(?:{_NAMES})\.md$", re.M)
BLOCK_ENDS = (
    "\n## Silent Replies\n",
    "\n<!-- OPENCLAW_CACHE_BOUNDARY -->",
    "\n<!-- /openclaw:attempt:STABLE -->",
    "\n## Temporal Context\n",
    "\n## Runtime\n",
    "\n## Heartbeats\n",
)
MARKERS = (
    "<!-- openclaw:attempt:STABLE -->",
    "<!-- /openclaw:attempt:STABLE -->",
    "<!-- openclaw:attempt:DYNAMIC -->",
    "<!-- /openclaw:attempt:DYNAMIC -->",
    "<!-- OPENCLAW_CACHE_BOUNDARY -->",
    "# Project Context\n",
)
WRAP_START = re.compile(r'<<<EXTERNAL_UNTRUSTED_CONTENT id="([0-9a-f]+)">>>')
WRAP_END = re.compile(r'<<<END_EXTERNAL_UNTRUSTED_CONTENT id="([0-9a-f]+)">>>')


def u16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def bootstrap_bodies(system: str) -> dict[str, str]:
    """File path → body for every bootstrap file in the system prompt's Project Context."""
    start = system.find("# Project Context\n")
    if start < 0:
        return {}
    headings = list(BOOTSTRAP_HEADING.finditer(system, start))
    bodies: dict[str, str] = {}
    for i, m in enumerate(headings):
        body_start = m.end() + 1
        end = headings[i + 1].start() - 1 if i + 1 < len(headings) else len(system)
        for marker in BLOCK_ENDS:
            cut = system.find(marker, body_start - 1, end + 1)
            if cut >= 0:
                end = min(end, cut)
        bodies[m.group(0)[3:]] = system[body_start:end]
    return bodies


def tool_names(messages: list[dict[str, Any]]) -> dict[str, str]:
    """tool_call_id → function name, from the assistant messages."""
    names: dict[str, str] = {}
    for m in messages:
        for call in m.get("tool_calls") or []:
            names[call["id"]] = call["function"]["name"]
    return names


def check_received(
    sent: dict[str, Any], got: dict[str, Any], *, bootstrap: int, memory: int, web_fetch: int
) -> dict[str, int]:
    """Assert `got` is `sent` with every segment within its cap; count the clamped ones."""
    clamped = {"bootstrap": 0, "memory": 0, "web_fetch": 0}
    assert {k: v for k, v in got.items() if k != "messages"} == {
        k: v for k, v in sent.items() if k != "messages"
    }, "top-level fields must pass through untouched"
    sm, gm = sent["messages"], got["messages"]
    assert [(m["role"], m.get("tool_call_id")) for m in gm] == [
        (m["role"], m.get("tool_call_id")) for m in sm
    ], "message order, roles and tool_call ids must be untouched"
    names = tool_names(sm)
    for before, after in zip(sm, gm, strict=True):
        if before["role"] == "system":
            for marker in MARKERS:
                assert after["content"].count(marker) == before["content"].count(marker), marker
            old, new = bootstrap_bodies(before["content"]), bootstrap_bodies(after["content"])
            assert list(old) == list(new), "every bootstrap file keeps its heading"
            for path, body in new.items():
                assert u16(body) <= bootstrap, f"{path}: {u16(body)} > {bootstrap}"
                if u16(old[path]) <= bootstrap:
                    assert body == old[path], f"{path} was under its cap and must be untouched"
                else:
                    clamped["bootstrap"] += 1
                    assert "truncated" in body, f"{path}: a clamp must say so inline"
        elif before["role"] == "tool":
            name = names[before["tool_call_id"]]
            payload = json.loads(after["content"])  # valid JSON stays valid JSON
            original = json.loads(before["content"])
            if name == "web_fetch":
                text = payload["text"]
                assert u16(text) <= web_fetch, f"web_fetch text {u16(text)} > {web_fetch}"
                starts, ends = WRAP_START.findall(text), WRAP_END.findall(text)
                assert starts == ends == WRAP_START.findall(original["text"])
                assert payload["length"] == u16(text)
                if u16(original["text"]) > web_fetch:
                    clamped["web_fetch"] += 1
                    assert payload["truncated"] is True
            elif name == "memory_search":
                total = sum(u16(r["snippet"]) for r in payload["results"])
                assert total <= memory, f"memory_search snippets {total} > {memory}"
                if sum(u16(r["snippet"]) for r in original["results"]) > memory:
                    clamped["memory"] += 1
            elif name == "memory_get":
                assert u16(payload["text"]) <= memory
                if u16(original["text"]) > memory:
                    clamped["memory"] += 1
                    assert payload.get("truncated") is True
        else:
            assert after == before, f"{before['role']} messages pass through untouched"
    return clamped


def as_chat(body: dict[str, Any], wire: str, known: dict[str, str] | None = None) -> dict[str, Any]:
    """A Messages or Responses body as chat messages (system texts, tool calls and results,
    texts joined), so `check_received` can grade it. Written from OPENCLAW_WIRE_FORMATS.md.
    `known`: call id → tool name of calls the body answers but does not carry (continuations).
    """
    out: list[dict[str, Any]] = []
    if known:
        calls = [{"id": i, "function": {"name": n}} for i, n in known.items()]
        out.append({"role": "assistant", "tool_calls": calls})

    def text(content: Any) -> str:
        if isinstance(content, str):
            return content
        return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))

    if wire == "messages":
        system = body.get("system")
        blocks = [{"text": system}] if isinstance(system, str) else system or []
        out.extend({"role": "system", "content": b["text"]} for b in blocks if "text" in b)
        for m in body["messages"]:
            content = m["content"] if isinstance(m["content"], list) else []
            if m["role"] == "system":
                out.append({"role": "system", "content": text(m["content"])})
            calls = [b for b in content if b.get("type") == "tool_use"]
            if calls:
                out.append(
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"id": c["id"], "function": {"name": c["name"]}} for c in calls
                        ],
                    }
                )
            for b in content:
                if b.get("type") == "tool_result":
                    content_text = text(b.get("content"))
                    out.append(
                        {"role": "tool", "tool_call_id": b["tool_use_id"], "content": content_text}
                    )
    else:
        if isinstance(body.get("instructions"), str):
            out.append({"role": "system", "content": body["instructions"]})
        for item in body["input"] if isinstance(body["input"], list) else []:
            if item.get("role") in ("system", "developer"):
                out.append({"role": "system", "content": text(item["content"])})
            elif item.get("type") == "function_call":
                call = {"id": item["call_id"], "function": {"name": item["name"]}}
                out.append({"role": "assistant", "tool_calls": [call]})
            elif item.get("type") == "function_call_output":
                output = {"role": "tool", "tool_call_id": item["call_id"]}
                out.append({**output, "content": text(item["output"])})
    return {"messages": out}


def skeleton(value: Any) -> Any:
    """`value` with every string under a `text`, `content` or `output` key blanked: what a clamp
    may never change (blocks, items, ids, `cache_control`, thinking, every other field)."""
    if isinstance(value, dict):
        return {
            k: "<text>"
            if k in ("text", "content", "output") and isinstance(v, str) and k != "thinking"
            else skeleton(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [skeleton(v) for v in value]
    return value
