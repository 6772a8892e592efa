"""The offload seam as a transport (issue 34): the pipeline holds a request's `Work` and never
asks where it runs, the wire formats' requests carry nothing of the offload, the block type
has one interface whether it holds bytes or a digest, and what a format keeps in this process
crosses to the worker through the format's own method."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

from ctxbudget.proxy.pipeline.offload import OffloadedRequest
from ctxbudget.proxy.pipeline.work import Here, Work
from ctxbudget.proxy.wire import AnthropicMessages, ChatCompletions, OpenAIResponses
from ctxbudget.proxy.wire.types import WireRequest

ROOT = Path(__file__).resolve().parents[3]
HOOKS = {
    "as_sent",
    "tally",
    "prune",
    "settle",
    "memory_added",
    "defer_count",
    "upstream_body",
    "litellm_values",
}
"""What the pipeline asks of a request beside its format: `Work`'s, not `WireRequest`'s."""


def _members(cls: type) -> set[str]:
    return {n for n in vars(cls) if not n.startswith("_")} | set(
        getattr(cls, "__annotations__", {})
    )


def test_a_wire_request_carries_no_offload_hook() -> None:
    assert not _members(WireRequest) & HOOKS
    assert HOOKS <= _members(Work)
    for work in (Here, OffloadedRequest):  # here or in the worker: the same questions
        assert _members(Work) <= _members(work) | {"body"}, work


def test_only_the_block_module_tells_bytes_from_digests() -> None:
    found = set()
    for path in sorted((ROOT / "proxy").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "isinstance"
                and "Digested" in ast.unparse(node.args[1])
            ):
                found.add(str(path.relative_to(ROOT)))
    assert found == {"proxy/cache/blocks.py"}


def test_the_offload_names_no_wire_format() -> None:
    for name in ("offload.py", "jobs.py", "executor.py", "work.py"):
        source = (ROOT / "proxy" / "pipeline" / name).read_text()
        for module in ("proxy.wire.chat", "proxy.wire.messages", "proxy.wire.responses"):
            assert module not in source, f"{name} imports {module}"


def _asked(call_id: str) -> tuple[str, str] | None:
    """The worker's way to ask its parent, here answered as the parent would."""
    return ANSWERS.get(call_id)


ANSWERS: dict[str, tuple[str, str]] = {}


def test_each_format_crosses_to_the_worker_by_its_own_method() -> None:
    for wire in (ChatCompletions(), AnthropicMessages()):
        assert wire.in_worker("o", _asked) == (wire, None)  # nothing kept here to ask for
    parent = OpenAIResponses()
    parent.names.remember("o", "c1", "exec", '{"command":"ls"}')
    remote, lookup = parent.in_worker("o", _asked)
    assert lookup is not None
    copy = pickle.loads(pickle.dumps(remote))  # what goes down the pipe
    ANSWERS["c1"] = lookup("c1")  # the parent answers the worker's question, for its owner
    assert parent.in_worker("other", _asked)[1]("c1") is None  # never another owner's
    assert copy.names.get("o", "c1") == ("exec", '{"command":"ls"}')  # asked of the parent
    body = (
        b'{"model":"m","previous_response_id":"resp_1","input":[{"type":"function_call_output",'
        b'"call_id":"c1","output":"file_a file_b"}]}'
    )
    here, there = parent.parse(body, owner="o"), copy.parse(body, owner="o")
    assert here.blocks() == there.blocks() and here.user_turn() == there.user_turn()
