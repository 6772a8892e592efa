"""Requests as Claude Code 2.1.330 and Codex 0.169.0 send them (captured through tests/standin.py:
`docs/openclaw.md` "Claude Code and Codex on the wire"), for the tests that do not run the
real agents. Only the shapes and the parts ctxbudget reads are reproduced; long prompts are
shortened."""

from __future__ import annotations

import json
from typing import Any

EPHEMERAL = {"type": "ephemeral"}
PROJECT = "project instructions, checked into the codebase"
GLOBAL = "user's private global instructions for all projects"
RULES = "".join(f"Rule {i}: keep answers short and the workspace tidy.\n" for i in range(700))
BIG_MD = ("# Project rules\n\n" + RULES)[:30_000]
LOG = "".join(f"tests/test_{i:04d}.py::test_it PASSED\n" for i in range(1500)) + "1 failed\n"
FILE = "".join(f"{i}\tline {i} of the file\n" for i in range(1, 2001))  # Read's numbered lines
BETA = (
    "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,"
    "per-turn-control-2026-07-01,mid-conversation-tool-changes-2026-07-01,"
    "thinking-token-count-2026-05-13,advanced-tool-use-2025-11-20,effort-2025-11-24"
)


def reminder(*files: tuple[str, str, str]) -> str:
    """Claude Code's instruction block: `(path, description, body)` per file."""
    sections = "\n\n".join(f"Contents of {p} ({d}):\n\n{b}" for p, d, b in files)
    return (
        "<system-reminder>\nCodebase and user instructions are shown below. Be sure to adhere "
        "to these instructions. IMPORTANT: These instructions OVERRIDE any default behavior and "
        f"you MUST follow them exactly as written.\n\n{sections}\n</system-reminder>"
    )


ATTRIBUTION = (
    "<system-reminder>\nAttribution for git commits and pull requests you create from here on: "
    "end git commit messages with Co-Authored-By: Claude.\n</system-reminder>\n"
)


def claude_code_request(
    *,
    prompt: str = "Read note.txt and run the tests",
    claude_md: str = BIG_MD,
    turns: list[tuple[str, dict[str, Any], Any]] | None = None,
    mcp_tools: int = 0,
    deferred: bool = True,
    model: str = "claude-sonnet-4-5",
) -> dict[str, Any]:
    """A Claude Code `/v1/messages?beta=true` body: the reminders and the user's prompt in the
    first user message, the environment as a `role: "system"` message, then one assistant
    turn (signed thinking, text, tool_use) and one user turn (tool_result) per `turns` entry
    `(tool, input, result content)`, the newest result marked `cache_control`. `mcp_tools`
    MCP tools (`mcp__inventory__lookup_NNN`) are deferred (`defer_loading`) or inline."""
    first = {
        "role": "user",
        "content": [
            {"type": "text", "text": reminder(("/w/CLAUDE.md", PROJECT, claude_md))},
            {"type": "text", "text": ATTRIBUTION},
            {"type": "text", "text": prompt},
        ],
    }
    environment = {
        "role": "system",
        "content": [
            {
                "type": "text",
                "text": "# Environment\nYou have been invoked in the following environment: \n"
                " - Primary working directory: /w\n",
                "cache_control": EPHEMERAL,
            }
        ],
    }
    messages: list[dict[str, Any]] = [first, environment]
    for n, (tool, arguments, result) in enumerate(turns or []):
        tool_id = f"toolu_{n:02d}abcdef"
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "", "signature": f"sig{n}+/=="},
                    {"type": "text", "text": f"calling {tool}"},
                    {"type": "tool_use", "id": tool_id, "name": tool, "input": arguments},
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [{"tool_use_id": tool_id, "type": "tool_result", "content": result}],
            }
        )
    if turns:
        messages[-1]["content"][-1]["cache_control"] = EPHEMERAL
    tools: list[dict[str, Any]] = [
        {"name": name, "description": f"The {name} tool.", "input_schema": {"type": "object"}}
        for name in ("Bash", "Edit", "Read", "ToolSearch", "Write")
    ]
    tools.append(
        {
            "name": "DeferredToolPlaceholder",
            "description": "Reserved placeholder that keeps deferred tool loading active.",
            "input_schema": {"type": "object", "properties": {}},
            "defer_loading": True,
        }
    )
    for i in range(mcp_tools):
        tool = mcp_tool(i)
        if deferred:
            tool["defer_loading"] = True
        tools.append(tool)
    return {
        "model": model,
        "messages": messages,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.330.cfd;"},
            {"type": "text", "text": "You are a Claude agent.", "cache_control": EPHEMERAL},
        ],
        "tools": tools,
        "metadata": {"user_id": json.dumps({"session_id": "8d835f32-c2fc-448e"})},
        "max_tokens": 32000,
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "medium"},
        "stream": True,
    }


def mcp_tool(i: int) -> dict[str, Any]:
    """An MCP tool definition as Claude Code declares it (`mcp__<server>__<tool>`)."""
    return {
        "name": f"mcp__inventory__lookup_{i:03d}",
        "description": f"Look up record kind {i} in the inventory database. "
        + "Returns the matching records with their fields. " * 8,
        "input_schema": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look up"},
                "limit": {"type": "integer", "description": "How many records at most"},
            },
            "required": ["query"],
        },
    }


def summariser_request(page: str, prompt: str = "Summarise the page") -> dict[str, Any]:
    """Claude Code's WebFetch summariser request: its own request, one user text block."""
    text = (
        f"\nWeb page content:\n---\n{page}\n---\n\n{prompt}\n\nProvide a concise response "
        "based only on the content above. In your response:\n - Never produce or reproduce "
        "exact song lyrics.\n\n"
    )
    return {
        "model": "claude-sonnet-4-5",
        "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.330.2fd;"},
            {"type": "text", "text": "You are a Claude agent."},
        ],
        "tools": [],
        "metadata": {"user_id": json.dumps({"session_id": "8d835f32-c2fc-448e"})},
        "max_tokens": 32000,
        "stream": True,
    }


def codex_request(
    *,
    prompt: str = "Run cat note.txt",
    agents_md: str = ("# Agents\n\n" + RULES)[:30_000],
    outputs: list[tuple[str, dict[str, Any], str]] | None = None,
) -> dict[str, Any]:
    """A Codex `/v1/responses` body: developer messages, the AGENTS.md + environment user
    item, the user's prompt item, then a reasoning item, function_call and
    function_call_output per `outputs` entry `(tool, arguments, output)`."""
    items: list[dict[str, Any]] = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "You are a coding agent running in Codex."}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [
                {
                    "type": "input_text",
                    "text": "# AGENTS.md instructions for /w\n\n<INSTRUCTIONS>\n"
                    f"{agents_md}\n</INSTRUCTIONS>",
                },
                {
                    "type": "input_text",
                    "text": "<environment_context>\n  <cwd>/w</cwd>\n</environment_context>",
                },
            ],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]},
    ]
    for n, (tool, arguments, output) in enumerate(outputs or []):
        call_id = f"call_{n:02d}abcdef"
        items += [
            {
                "type": "reasoning",
                "id": f"rs_{n}",
                "summary": [{"type": "summary_text", "text": "thinking"}],
                "content": None,
                "encrypted_content": f"gAAAAB{n}",
            },
            {
                "type": "function_call",
                "id": f"fc_{n}",
                "name": tool,
                "arguments": json.dumps(arguments),
                "call_id": call_id,
            },
            {"type": "function_call_output", "call_id": call_id, "output": output},
        ]
    return {
        "model": "gpt-5",
        "stream": True,
        "input": items,
        "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199-codex-session",
    }


def exec_output(text: str) -> str:
    """Codex's exec_command result text."""
    return (
        "Chunk ID: a71e97\nWall time: 0.0000 seconds\nProcess exited with code 0\n"
        f"Original token count: {len(text) // 4}\nOutput:\n{text}"
    )
