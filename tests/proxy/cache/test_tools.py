"""The MCP tool definitions a request sends inline (Claude Code with tool search off)."""

from __future__ import annotations

import doctest

import orjson

import ctxbudget.proxy.cache.tools
import ctxbudget.proxy.report.render
from ctxbudget.proxy.cache.tools import inline_mcp_tools
from tests.agents import claude_code_request


def test_doctests() -> None:
    assert doctest.testmod(ctxbudget.proxy.cache.tools).failed == 0
    assert doctest.testmod(ctxbudget.proxy.report.render).failed == 0


def test_only_mcp_tools_without_defer_loading_count() -> None:
    inline = claude_code_request(mcp_tools=60, deferred=False)["tools"]
    found = inline_mcp_tools(orjson.dumps(inline))
    assert found is not None and found.count == 60
    assert [t["name"] for t in orjson.loads(found.definitions)][:2] == [
        "mcp__inventory__lookup_000",
        "mcp__inventory__lookup_001",
    ]
    deferred = claude_code_request(mcp_tools=60, deferred=True)["tools"]
    assert inline_mcp_tools(orjson.dumps(deferred)) is None  # tool search: names only
    assert inline_mcp_tools(inline) == found  # the parsed list reads the same
    assert inline_mcp_tools(b"[not json") is None
    assert inline_mcp_tools(b'{"mcp__x": 1}') is None  # not a list of tools
