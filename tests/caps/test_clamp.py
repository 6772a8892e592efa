from __future__ import annotations

import copy
import doctest

from ctxbudget.caps import Caps, clamp_request, types
from tests.openclaw import openclaw_request, system_prompt

CAPS = Caps(bootstrap_max_chars=1000, memory_max_chars=500, web_fetch_max_chars=1500)


def test_request_without_messages_is_returned_as_is() -> None:
    request = {"model": "m", "prompt": "legacy"}
    result = clamp_request(request, CAPS)
    assert result.request is request and result.segments == () and not result.changed


def test_system_prompt_as_content_parts_and_developer_role() -> None:
    parts = [{"type": "text", "text": "intro"}, {"type": "text", "text": system_prompt()}]
    request = {"messages": [{"role": "developer", "content": parts}]}
    result = clamp_request(request, CAPS)
    assert result.changed
    assert result.request["messages"][0]["content"][0] is parts[0]
    assert all(s.after <= 1000 for s in result.segments)
    assert {s.message_index for s in result.segments} == {0}


def test_the_input_is_never_mutated_and_untouched_messages_are_shared() -> None:
    request = openclaw_request()
    before = copy.deepcopy(request)
    result = clamp_request(request, CAPS)
    assert request == before
    assert result.changed
    assert result.request["tools"] is request["tools"]
    assert result.request["messages"][1] is request["messages"][1]
    kinds = {s.kind for s in result.segments if s.action == "clamped"}
    assert kinds == {"bootstrap", "web_fetch", "memory"}


def test_segments_point_at_their_messages() -> None:
    request = openclaw_request()
    result = clamp_request(request, CAPS)
    for segment in result.segments:
        message = request["messages"][segment.message_index]
        assert message["role"] == ("system" if segment.kind == "bootstrap" else "tool")


def test_what_the_clamp_cannot_read_is_left_as_it_came() -> None:
    # a role or tool_calls of the wrong type raised, so the clamp gave up on every segment
    # (or, with failClosed, the request got a 500) (issue 24)
    request = openclaw_request()
    request["messages"][1] = {"role": ["user"], "content": "odd"}
    request["messages"].insert(2, {"role": "assistant", "content": None, "tool_calls": 1})
    result = clamp_request(request, CAPS)
    assert result.request["messages"][1] is request["messages"][1]
    assert result.request["messages"][2] is request["messages"][2]
    kinds = {s.kind for s in result.segments if s.action == "clamped"}
    assert kinds == {"bootstrap", "web_fetch", "memory"}


def test_a_segment_copied_with_a_change_is_a_new_segment() -> None:
    # `evolve` stands in for dataclasses.replace on the request path (issue 25)
    assert doctest.testmod(types).failed == 0


def test_caps_hash_by_their_fields_however_they_were_made() -> None:
    """The caps' hash is made once per object (the clamp caches key on them): equal caps hash
    alike, and a copy with a field changed (`replace`, `evolve`) hashes as its own fields."""
    from dataclasses import replace

    from ctxbudget.caps.types import PrunePolicy, ToolNames, evolve

    policy = PrunePolicy(min_chars=10)
    caps = Caps(bootstrap_max_chars=100, prune=policy, pruned=(("c1", "d1", None),))
    same = Caps(
        bootstrap_max_chars=100, prune=PrunePolicy(min_chars=10), pruned=(("c1", "d1", None),)
    )
    assert hash(caps) == hash(same) and {caps: 1}[same] == 1
    for changed in (replace(caps, bootstrap_max_chars=5), evolve(caps, bootstrap_max_chars=5)):
        made = Caps(bootstrap_max_chars=5, prune=policy, pruned=(("c1", "d1", None),))
        assert changed == made and hash(changed) == hash(made)
        assert {made: 1}.get(changed) == 1 and {caps: 1}.get(changed) is None
    assert hash(ToolNames(web_fetch=frozenset({"fetch"}))) == hash(
        ToolNames(web_fetch=frozenset({"fetch"}))
    )


def test_caps_sent_to_another_process_hash_as_that_process_hashes_them() -> None:
    """The offload worker is a fresh interpreter with its own string hash seed, and the caps
    reach it pickled: their hash made here must not go with them (an equal `Caps` made
    there hashed otherwise: a == b with hash(a) != hash(b), each cache keeping both)."""
    import os
    import pickle
    import subprocess
    import sys

    from ctxbudget.caps.types import PrunePolicy, ToolNames

    caps = Caps(
        tool_output_max_chars=100, prune=PrunePolicy(deny=("exec",)), pruned=(("c", "d", None),)
    )
    tools = ToolNames(web_fetch=frozenset({"fetch"}))
    hash(caps), hash(tools)  # made here, as the request path does before handing them over
    check = (
        "import pickle, sys\n"
        "from ctxbudget.caps.types import Caps, PrunePolicy, ToolNames\n"
        "caps, tools = pickle.loads(sys.stdin.buffer.read())\n"
        "made = Caps(tool_output_max_chars=100, prune=PrunePolicy(deny=('exec',)),"
        " pruned=(('c', 'd', None),))\n"
        "assert caps == made and hash(caps) == hash(made), 'caps'\n"
        "names = ToolNames(web_fetch=frozenset({'fetch'}))\n"
        "assert tools == names and hash(tools) == hash(names), 'tools'\n"
    )
    for seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-c", check],
            input=pickle.dumps((caps, tools)),
            capture_output=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
            check=False,
        )
        assert done.returncode == 0, done.stderr.decode()[-500:]
