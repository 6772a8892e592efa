"""Synthesised Claude Code sessions for `bench/pruning.py`: the shape that ended a warm
session above direct under `pays` (issue 31), made from the recorded Claude Code session.

Claude Code's wire (`bench/sessions/claude-code.jsonl.xz`, `shared/OPENCLAW_WIRE_FORMATS.md`
§7): Anthropic Messages, `POST /v1/messages?beta=true`, streamed; breakpoints on two system
blocks and on the last block of the newest message. A new user prompt goes as a block list
while it is the newest message (marked), then as a plain string once the model has answered
it: the entry written at its breakpoint is never read again.

The shape: a prompt every 2 requests (the model answers it with one tool call, ~10 KB of
file or command output, then with text, and the user asks the next thing), five prompts a
task (so the `gaps` schedule has idle gaps every 10 requests). The system prompt, tools, the
first user message and the environment come from the recording's first request, the outputs
from its tool results (each made distinct by its turn), so the blocks weigh what real ones do.
A session of `n` requests is the first `n` of the longest: sessions that end soon after a
prune, wherever the rule took it.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from tests.replay import Recorded, Session

RESULT_BYTES = 10_000
"""About what each tool result holds (Claude Code's file reads and command outputs)."""
PROMPTS_PER_TASK = 5
NAME = "cc-prompt2"
LENGTHS = (10, 20, 40, 50, 74, 80)
"""Requests in each synthesised session (50 the main one: 20-60 turns; the others end at
different points of the run: 74 just after the warm prune the old rule took at request 73 of
the 5-minute always-warm schedule, never repaid)."""


def claude_code_shaped(template: Session, lengths: tuple[int, ...] = LENGTHS) -> list[Session]:
    """Sessions of `lengths` requests in Claude Code's shape, from the recorded `template`."""
    longest = _requests(template, max(lengths))
    out = []
    for n in lengths:
        meta = {**template.meta, "session": f"{NAME}-{n}", "requests": n, "synthesised": True}
        meta["tasks"] = (n + 2 * PROMPTS_PER_TASK - 1) // (2 * PROMPTS_PER_TASK)
        out.append(Session(meta, longest[:n]))
    return out


def _requests(template: Session, count: int) -> list[Recorded]:
    first = template.requests[1].json  # the environment already a plain string, as resent
    head = copy.deepcopy(first["messages"][:2])  # the first user message, the environment
    for m in head:
        for b in m["content"] if isinstance(m["content"], list) else ():
            b.pop("cache_control", None)
    outputs = _outputs(template)
    signature = "iLmB3pLjw4K3Z/gXDKsNFjxoppmahbz6DIkSEAHsr8U="
    tail: list[dict[str, Any]] = []  # the messages after `head`, as they are resent
    requests: list[Recorded] = []
    prompt = "Task 1/9: read the code and say how json5 parses a number."
    for i in range(count):
        if i % 2 == 0:  # a new prompt: the newest message, a marked block list
            newest = {"role": "user", "content": [{"type": "text", "text": prompt}]}
        else:  # the model called a tool on the prompt: its result is the newest message
            call = f"toolu_{i:04d}{'a' * 20}"
            tail[-1] = {"role": "user", "content": prompt}  # resent as a plain string
            tail.append(
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "", "signature": signature},
                        {"type": "text", "text": f"Looking at step {i}."},
                        {
                            "type": "tool_use",
                            "id": call,
                            "name": "Bash",
                            "input": {"command": f"sed -n '{i},+200p' json5/lib.py"},
                        },
                    ],
                }
            )
            output = outputs[i % len(outputs)]
            newest = {
                "role": "user",
                "content": [
                    {"tool_use_id": call, "type": "tool_result", "content": f"# step {i}\n{output}"}
                ],
            }
        body = {**first, "messages": [*head, *tail, newest]}
        body["messages"][-1] = mark(newest)
        task = 1 + i // (2 * PROMPTS_PER_TASK)
        requests.append(
            Recorded(
                task,
                "POST",
                "/v1/messages",
                "beta=true",
                dict(template.requests[1].headers),
                json.dumps(body, ensure_ascii=False).encode(),
            )  # fmt: skip
        )
        tail.append(newest)
        if i % 2 == 1:  # the model answers in text; the user asks the next thing
            tail.append(
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "", "signature": signature},
                        {"type": "text", "text": f"Step {i} done: the output above says it."},
                    ],
                }
            )
            prompt = f"Task {task}/9, step {i + 1}: now check the next part the same way."
    return requests


def mark(message: dict[str, Any]) -> dict[str, Any]:
    """`message` with its last block marked, as Claude Code marks the newest message."""
    marked = copy.deepcopy(message)
    marked["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return marked


def _outputs(template: Session) -> list[str]:
    """~`RESULT_BYTES` outputs cut from the recording's tool results, in order."""
    found: list[str] = []
    for m in template.requests[-1].json["messages"]:
        for b in m["content"] if isinstance(m["content"], list) else ():
            if b.get("type") == "tool_result" and isinstance(b.get("content"), str):
                found.append(b["content"])
    text = "\n".join(found)
    step = RESULT_BYTES // 2
    return [text[at : at + RESULT_BYTES] for at in range(0, len(text) - RESULT_BYTES, step)]
