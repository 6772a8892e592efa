"""One OpenClaw conversation grown turn by turn, as `bench/stages.py --grow` replays it.

Request N+1 is request N plus one tool call and its result (1–4 KB: a file read, a command's
output, a fetched page, a memory search), the way an OpenClaw tool loop grows; every tenth
turn the model answers in text and the user asks again. Each request ends with OpenClaw's
internal-context message, which the next one drops.

- `chat`: chat completions as OpenClaw 9.x sends them (tests/openclaw.py's shapes).
- `messages`: Anthropic Messages as OpenClaw sends them (OPENCLAW_WIRE_FORMATS.md §3): the
  system prompt as two text blocks, `cache_control` on `system[0]`, the last tool, the latest
  user text and the newest `tool_result` (the marker moves to the newest result each request,
  so the block before it changes), thinking blocks with signatures on each assistant turn.
- `responses`: OpenAI Responses as OpenClaw's default custom provider sends them
  (OPENCLAW_WIRE_FORMATS.md §4, `store: false`): the system prompt as `input[0]`, the
  internal-context message moved up to `input[2]`, then `function_call` and
  `function_call_output` items, a reasoning item with encrypted content before each call.

Deterministic: the same turns every run (a seeded `random.Random`).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.openclaw import (  # noqa: E402
    INTERNAL_CONTEXT,
    default_files,
    memory_search_result,
    system_prompt,
    web_fetch_result,
)

EPHEMERAL = {"type": "ephemeral"}
WORDS = (
    "config request session budget clamp token cache prune window history result value "
    "parser upstream report server client stream handler worker memory store index query"
).split()


def _text(rng: random.Random, chars: int, line: str = "") -> str:
    out: list[str] = []
    size = 0
    while size < chars:
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12)))
        piece = f"{line}{len(out) + 1}: {words}"
        out.append(piece)
        size += len(piece) + 1
    return "\n".join(out)[:chars]


def _tool_turn(rng: random.Random, turn: int) -> tuple[str, dict[str, Any], str]:
    """One tool call (name, arguments) and its result, 1–4 KB."""
    size = rng.randint(1_000, 4_000)
    kind = turn % 4
    if kind == 0:
        path = f"/home/agent/project/src/module_{turn}.py"
        return "read", {"path": path}, _text(rng, size, "    def line")
    if kind == 1:
        command = f"pytest tests/test_{turn}.py -q"
        return "exec", {"command": command}, _text(rng, size, "PASSED tests/test_x.py::case")
    if kind == 2:
        url = f"https://example.com/docs/{turn}"
        page = _text(rng, max(size - 600, 200), "Paragraph ")
        return "web_fetch", {"url": url}, web_fetch_result(url=url, content=page)
    snippets = [f"- fact {i}: " + _text(rng, size // 5) for i in range(4)]
    return "memory_search", {"query": f"topic {turn}"}, memory_search_result(snippets=snippets)


def _turns(turns: int) -> list[tuple[str, dict[str, Any], str, str | None]]:
    """Each turn's tool call, its result, and the user's next question every tenth turn."""
    rng = random.Random(300)
    out = []
    for turn in range(turns):
        name, args, result = _tool_turn(rng, turn)
        asks = (
            f"[Sun 2026-11-22 12:{turn % 60:02d} UTC] Now check part {turn}."
            if turn % 10 == 9
            else None
        )
        out.append((name, args, result, asks))
    return out


def chat_bodies(turns: int) -> list[bytes]:
    """`turns` chat completions requests of one conversation, each the last plus a turn."""
    history: list[dict[str, Any]] = [
        {"role": "system", "content": system_prompt(version="9.x", files=default_files())},
        {
            "role": "user",
            "content": "[Sun 2026-11-22 11:28 UTC] Work through the tasks.\n\n"
            "Runtime: agent=main | host=vm",
        },
    ]
    tools = _tool_specs()
    bodies = []
    for turn, (name, args, result, asks) in enumerate(_turns(turns)):
        call_id = f"call_{turn:04d}_{name}"
        arguments = json.dumps(args, separators=(",", ":"))
        history.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    }
                ],
            }
        )
        history.append({"role": "tool", "tool_call_id": call_id, "content": result})
        if asks:
            history.append({"role": "assistant", "content": f"Done with part {turn}."})
            history.append({"role": "user", "content": asks})
        messages = [
            *history,
            {"role": "user", "content": [{"type": "text", "text": INTERNAL_CONTEXT}]},
        ]
        body = {
            "model": "gpt-4o",
            "messages": messages,
            "stream": False,
            "tools": [{"type": "function", "function": t} for t in tools],
            "tool_choice": "auto",
            "max_completion_tokens": 4096,
        }
        bodies.append(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode())
    return bodies


def messages_bodies(turns: int) -> list[bytes]:
    """`turns` Anthropic Messages requests of one conversation, as OpenClaw sends them."""
    prompt = system_prompt(version="9.x", files=default_files())
    cut = prompt.find("## Runtime")
    stable, dynamic = (prompt[:cut], prompt[cut:]) if cut > 0 else (prompt, "Runtime: agent=main")
    system = [
        {"type": "text", "text": stable, "cache_control": EPHEMERAL},
        {"type": "text", "text": dynamic},
    ]
    tools = [
        {"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
        for t in _tool_specs()
    ]
    tools[-1] = {**tools[-1], "cache_control": EPHEMERAL}
    first = "[Sun 2026-11-22 11:28 UTC] Work through the tasks."
    history: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": first}]}]
    bodies = []
    for turn, (name, args, result, asks) in enumerate(_turns(turns)):
        tool_id = f"toolu_{turn:04d}{name}"
        history.append(
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "thinking",
                        "thinking": f"Next, {name} for part {turn}.",
                        "signature": "EqQB" + "s1gnatur3" * 12,
                    },
                    {"type": "text", "text": f"Calling {name} next."},
                    {"type": "tool_use", "id": tool_id, "name": name, "input": args},
                ],
            }
        )
        history.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": tool_id,
                        "content": result,
                        "is_error": False,
                    }
                ],
            }
        )
        if asks:
            history.append(
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": f"Done with part {turn}."}],
                }
            )
            history.append({"role": "user", "content": [{"type": "text", "text": asks}]})
        body = {
            "model": "claude-sonnet-4-5",
            "messages": [
                *_marked(history),
                {"role": "user", "content": [{"type": "text", "text": INTERNAL_CONTEXT}]},
            ],
            "max_tokens": 4096,
            "stream": False,
            "system": system,
            "tools": tools,
        }
        bodies.append(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode())
    return bodies


def responses_bodies(turns: int) -> list[bytes]:
    """`turns` OpenAI Responses requests of one conversation, as OpenClaw sends them."""
    prompt = system_prompt(version="9.x", files=default_files())
    first = "[Sun 2026-11-22 11:28 UTC] Work through the tasks."
    history: list[dict[str, Any]] = [
        _input_message("system", prompt),
        _input_message("user", first),
        _input_message("user", INTERNAL_CONTEXT),
    ]
    tools = [{"type": "function", **t} for t in _tool_specs()]
    bodies = []
    for turn, (name, args, result, asks) in enumerate(_turns(turns)):
        call_id = f"call_{turn:04d}_{name}"
        history.append(
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": f"Next, {name} for part {turn}."}],
                "encrypted_content": "gAAAAB" + "3ncrypt3d" * 16,
            }
        )
        history.append(
            {
                "type": "function_call",
                "call_id": call_id,
                "name": name,
                "arguments": json.dumps(args, separators=(",", ":")),
            }
        )
        history.append({"type": "function_call_output", "call_id": call_id, "output": result})
        if asks:
            history.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": f"Done with part {turn}."}],
                }
            )
            history.append(_input_message("user", asks))
        body = {
            "model": "gpt-4.1",
            "input": history,
            "stream": False,
            "max_output_tokens": 4096,
            "tools": tools,
            "store": False,
        }
        bodies.append(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode())
    return bodies


def _input_message(role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


def _marked(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`history` with OpenClaw's two moving markers: the newest `tool_result` and the latest
    user text (copies of those messages only)."""
    out = list(history)
    placed = {"tool_result": False, "text": False}
    for i in range(len(out) - 1, -1, -1):
        message = out[i]
        if message["role"] != "user":
            continue
        block = message["content"][-1]
        kind = block["type"]
        if kind in placed and not placed[kind]:
            placed[kind] = True
            out[i] = {
                **message,
                "content": [*message["content"][:-1], {**block, "cache_control": EPHEMERAL}],
            }
        if all(placed.values()):
            break
    return out


def _tool_specs() -> list[dict[str, Any]]:
    names = [
        "read",
        "write",
        "edit",
        "exec",
        "process",
        "web_search",
        "web_fetch",
        "memory_search",
        "memory_get",
    ]
    names += [f"tool_{i}" for i in range(16)]
    return [
        {
            "name": name,
            "description": f"{name}: does a useful thing with files, the web or the workspace.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Path to operate on."},
                    "limit": {"type": "integer", "minimum": 1, "description": "How many."},
                },
                "required": [],
                "additionalProperties": True,
            },
        }
        for name in names
    ]


BUILDERS = {
    "chat": ("/v1/chat/completions", chat_bodies),
    "messages": ("/v1/messages", messages_bodies),
    "responses": ("/v1/responses", responses_bodies),
}
"""Each format's route and builder."""
