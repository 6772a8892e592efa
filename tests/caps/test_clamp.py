from __future__ import annotations

import copy
import doctest

from caps import Caps, clamp_request, types
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

    from caps.types import PrunePolicy, ToolNames, evolve

    policy = PrunePolicy(min_chars=10)
    caps = Caps(bootstrap_max_chars=100, prune=policy, pruned=(("c1", None),))
    same = Caps(bootstrap_max_chars=100, prune=PrunePolicy(min_chars=10), pruned=(("c1", None),))
    assert hash(caps) == hash(same) and {caps: 1}[same] == 1
    for changed in (replace(caps, bootstrap_max_chars=5), evolve(caps, bootstrap_max_chars=5)):
        made = Caps(bootstrap_max_chars=5, prune=policy, pruned=(("c1", None),))
        assert changed == made and hash(changed) == hash(made)
        assert {made: 1}.get(changed) == 1 and {caps: 1}.get(changed) is None
    assert hash(ToolNames(web_fetch=frozenset({"fetch"}))) == hash(
        ToolNames(web_fetch=frozenset({"fetch"}))
    )
