"""A small stdio MCP server of many tools, for Claude Code's tool search through the proxy.

    python tests/e2e/mcp_server.py 60      # 60 tools: lookup_000 ... lookup_059

Newline-delimited JSON-RPC 2.0 on stdin/stdout (the MCP stdio transport): `initialize`,
`tools/list` and `tools/call`; each call answers a long listing (`RECORDS` lines), long
enough for the tool-output cap. Standard library only: Claude Code starts it as a child.
"""

from __future__ import annotations

import json
import sys
from typing import Any

RECORDS = 1000
"""Lines in each tool's answer (~40 K chars: over the tool-output cap, under Claude Code's own
MAX_MCP_OUTPUT_TOKENS, past which it saves the answer to a file and sends a note)."""


_EMPTY = {
    "resources/list": "resources",
    "resources/templates/list": "resourceTemplates",
    "prompts/list": "prompts",
}


def tools(count: int) -> list[dict[str, Any]]:
    return [
        {
            "name": f"lookup_{i:03d}",
            "description": f"Look up record kind {i} in the inventory database. "
            + "Returns the matching records with their fields. " * 8,
            "inputSchema": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What to look up"},
                    "limit": {"type": "integer", "description": "How many records at most"},
                },
                "required": ["query"],
            },
        }
        for i in range(count)
    ]


def answer(name: str) -> str:
    lines = "".join(f"record {n:05d}: kind={name} status=ok\n" for n in range(RECORDS))
    return f"{name}: {RECORDS} records\n{lines}end of {name}\n"


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        ident, method = message.get("id"), message.get("method")
        if ident is None:  # a notification: nothing to answer
            continue
        params = message.get("params") or {}
        result: Any
        if method == "initialize":
            result = {
                "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "inventory", "version": "1.0"},
            }
        elif method == "tools/list":
            result = {"tools": tools(count)}
        elif method == "tools/call":
            text = answer(str(params.get("name")))
            result = {"content": [{"type": "text", "text": text}]}
        elif method in _EMPTY:
            result = {_EMPTY[method]: []}
        elif method == "ping":
            result = {}
        else:
            error = {"code": -32601, "message": f"method not found: {method}"}
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": ident, "error": error}) + "\n")
            sys.stdout.flush()
            continue
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": ident, "result": result}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
