"""The holdout stage: a conversation's arm, decided before anything changes the body.

With `contextBudget.holdout` set (and the budget on), each conversation is in the `budget`
arm (clamped and pruned as configured) or the `holdout` arm (sent exactly as with the budget
off; memory injection is its own switch and stays as it is), drawn once and kept in the
report's database (`proxy/report/arms.py`). The conversation id is the one pruning files its
decisions under (`ClientPrefix.conversation`): made of what the client sent, never of what
ctxbudget forwards, so it is the same in both arms and in every process.

A request that chose for itself (`x-context-budget: on|off`) is served as it asked, and its
conversation leaves the comparison (`chosen`); it has no arm header.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ctxbudget.caps import Segment
from ctxbudget.memory.query import UserTurn
from ctxbudget.proxy.cache.blocks import Block, readable
from ctxbudget.proxy.cache.prefix import ClientPrefix
from ctxbudget.proxy.config.settings import Settings
from ctxbudget.proxy.pipeline.headers import PREFIX
from ctxbudget.proxy.report.arms import Arm, Arms
from ctxbudget.proxy.report.record import HoldoutMark

ARM_HEADER = f"{PREFIX}-arm"
_ACTED = ("clamped", "would-clamp")


@dataclass(frozen=True)
class Drawn:
    """A request's place in the comparison."""

    conversation: str
    arm: Arm
    chosen: bool
    """The request chose the budget itself (`x-context-budget`): not compared."""
    results: frozenset[str] = field(default=frozenset())
    """The call ids of the tool results in the request's history (`result_ids`)."""

    @property
    def held_out(self) -> bool:
        """Whether the request goes upstream as the client sent it."""
        return self.arm == "holdout" and not self.chosen


class HoldoutStage:
    """Draws each conversation's arm (one database round trip per conversation and process)."""

    def __init__(self, arms: Arms) -> None:
        self._arms = arms

    async def draw(
        self,
        settings: Settings,
        headers: Mapping[str, str],
        owner: str,
        prefix: ClientPrefix,
        session: str,
        *,
        now: float,
    ) -> Drawn | None:
        """The request's arm; None without a holdout (share 0, or the budget off: nothing to
        compare)."""
        if settings.holdout <= 0 or not settings.enabled:
            return None
        conversation = prefix.conversation(session)
        chosen = PREFIX in headers
        results = result_ids(prefix.blocks)
        arm = self._arms.known(owner, conversation)
        if arm is None:  # a conversation new to this process: the database decides
            arm = await self._draw(owner, conversation, settings, now)
        return Drawn(conversation, arm, chosen, results)

    async def _draw(self, owner: str, conversation: str, settings: Settings, now: float) -> Arm:
        return await asyncio.to_thread(
            self._arms.arm, owner, conversation, settings.holdout, at=now
        )


def result_ids(blocks: Sequence[Block]) -> frozenset[str]:
    """The call ids of the tool results in a request's history as the client sent it, in
    any format (a chat `tool` message, a Messages `tool_result` part, a Responses
    `*_output` item), whatever their size: the clamps' segments name only the results over
    a cap, and a held-out request's only those that would be (counting calls from them gave
    the budget arm 0.46 tool calls a turn and the holdout 0.23, where both made ~4.5).

    A block the offload process kept no bytes of (over 64 KB) is left to the segments: a
    result that large is over every cap, so its segment names it in either arm.

    >>> chat = Block("messages[2]", {"role": "tool", "tool_call_id": "c1"}, None)
    >>> part = {"type": "tool_result", "tool_use_id": "t1"}
    >>> messages = Block("messages[3]", {"role": "user", "content": [part]}, None)
    >>> responses = Block("input[4]", {"type": "function_call_output", "call_id": "r1"}, None)
    >>> sorted(result_ids([chat, messages, responses]))
    ['c1', 'r1', 't1']
    """
    found: set[str] = set()
    for block in blocks:
        if not block.label.startswith(("messages[", "input[")):
            continue
        value = readable(block.client, (None, "user", "tool"))  # results are in these
        if not isinstance(value, dict):
            continue
        if value.get("role") == "tool":
            found.add(str(value.get("tool_call_id")))
        elif str(value.get("type", "")).endswith("_output") and "call_id" in value:
            found.add(str(value["call_id"]))
        elif value.get("role") == "user" and isinstance(value.get("content"), list):
            found.update(
                str(part.get("tool_use_id"))
                for part in value["content"]
                if isinstance(part, dict) and part.get("type") == "tool_result"
            )
    return frozenset(found)


def mark(drawn: Drawn, segments: Sequence[Segment], turn: UserTurn | None) -> HoldoutMark:
    """What the report's comparison reads of the request: its turn, its tool calls so far,
    the calls made again after their first result was clamped or pruned, and whether it
    clamped or pruned anything new (would have, in the holdout arm).

    A call made again is found by its tool and its result's text before any clamp (the
    same command gives the same output), in the request's own history: each request resends
    the conversation so far, so the row keeps the largest count. A large body's segments
    come without their texts (the offload process kept them): its reruns are not counted.
    """
    calls = set(drawn.results)
    first: dict[tuple[str, int], bool] = {}
    reruns = 0
    acted = False
    since = turn.index if turn is not None else 0
    for s in sorted(segments, key=lambda s: s.message_index):
        done = s.action in _ACTED or s.kind == "pruned"
        # new this turn: a prune taken now, or a clamp of a result after the user's turn
        # (a clamped result is clamped again on every later request)
        acted = acted or (s.kind == "pruned" and s.note == "pruned now")
        acted = acted or (s.action in _ACTED and s.message_index >= since)
        if s.call_id is None or s.tool is None:
            continue
        calls.add(s.call_id)
        if not s.original:
            continue
        key = (s.tool, hash(s.original))  # a str keeps its hash: no hashing again per turn
        before = first.get(key)
        if before is None:
            first[key] = done
        elif before:
            reruns += 1
        else:
            first[key] = done
    return HoldoutMark(
        conversation=drawn.conversation,
        arm=drawn.arm,
        chosen=drawn.chosen,
        turn=turn is not None and turn.last,
        tool_calls=len(calls),
        reruns=reruns,
        acted=acted,
    )
