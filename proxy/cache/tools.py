"""Tool definitions a request sends inline that tool search would have deferred.

Every tool definition in `tools` is the first block of the cached prefix, paid on every request
(as cache reads when warm). Claude Code can defer its MCP tools instead (`defer_loading: true`,
found on demand by its ToolSearch tool through `tool_reference` blocks): then only their names
are sent. It sends them inline when tool search is off — `ENABLE_TOOL_SEARCH=false` or `auto`
(below 10% of the context window), `CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS=1` (even with
`ENABLE_TOOL_SEARCH=true`), an endpoint that refused `defer_loading` once, or a resumed
conversation that ran without it (docs/openclaw.md). The report flags such sessions with
what they pay for it (`toolsInline`).

Claude Code names MCP tools `mcp__<server>__<tool>`; its built-in tools are never counted.

>>> tools = b'[{"name": "Bash"}, {"name": "mcp__db__q", "input_schema": {}},'
>>> tools += b' {"name": "mcp__db__r", "defer_loading": true}]'
>>> found = inline_mcp_tools(tools)
>>> found.count, found.definitions
(1, b'[{"name":"mcp__db__q","input_schema":{}}]')
>>> inline_mcp_tools(b'[{"name": "Bash"}]') is None, inline_mcp_tools(None) is None
(True, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from caps._kept import weighed

MCP_PREFIX = "mcp__"


@dataclass(frozen=True)
class InlineTools:
    """MCP tool definitions one request sent inline."""

    count: int
    definitions: bytes = b""
    """Their JSON, for counting their tokens off the request path (empty once counted)."""
    tokens: int | None = None
    """Their tokens, when already counted (a large body's, in the offload process)."""


def inline_mcp_tools(raw_tools: Any, owner: str = "") -> InlineTools | None:
    """The MCP tools of a Messages request's `tools` (its JSON bytes, or the parsed list)
    that are sent inline; None when there are none. `owner`: whose request (what is kept of
    the bytes is found by owner too: another owner's same tools are parsed again)."""
    if raw_tools is None:
        return None
    if isinstance(raw_tools, bytes | bytearray | memoryview):
        if b'"mcp__' not in raw_tools:  # one C scan: no MCP tool at all
            return None
        return _inline(bytes(raw_tools), owner)
    return _from_list(raw_tools)


@weighed(8 << 20)
def _inline(raw: bytes, owner: str) -> InlineTools | None:
    # Claude Code sends the same tools on every request of a session: parse them once
    try:
        return _from_list(orjson.loads(raw))
    except orjson.JSONDecodeError:
        return None


def _from_list(tools: Any) -> InlineTools | None:
    if not isinstance(tools, list):
        return None
    inline = [
        t
        for t in tools
        if isinstance(t, dict)
        and isinstance(t.get("name"), str)
        and t["name"].startswith(MCP_PREFIX)
        and t.get("defer_loading") is not True
    ]
    if not inline:
        return None
    try:
        definitions = orjson.dumps(inline)
    except TypeError:  # a value orjson cannot write (a huge integer): count the names only
        definitions = orjson.dumps([t["name"] for t in inline])
    return InlineTools(count=len(inline), definitions=definitions)
