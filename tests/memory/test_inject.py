from __future__ import annotations

import copy
from typing import Any

from ctxbudget.memory import Memory
from ctxbudget.memory.inject import DAY, age, inject, line
from ctxbudget.memory.types import Source

NOW = 2_000_000_000.0
LINES = ["- Fact: Deploys on Tuesdays (today, you told me)", "- Fact: Oat milk (today, inferred)"]
BLOCK = (
    "User context:\n- Fact: Deploys on Tuesdays (today, you told me)\n"
    "- Fact: Oat milk (today, inferred)"
)
BASE: dict[str, Any] = dict(id=1, owner="default", scope="global", last_accessed=0, access_count=0)


def _memory(text: str, category: str, source: Source, *, days: float) -> Memory:
    return Memory(**BASE, text=text, category=category, source=source, created=NOW - days * DAY)


def _chat(last: object) -> list[Any]:
    return [
        {"role": "developer", "content": "Rules."},
        {"role": "system", "content": "More rules."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": last},
    ]


def test_age_boundaries() -> None:
    days = (0, 0.999, 1, 1.999, 2, 13, 13.999, 14, 59, 60, 400)
    assert " | ".join(age(d * DAY) for d in days) == (
        "today | today | yesterday | yesterday | 2 days ago | 13 days ago | 13 days ago"
        " | 2 weeks ago | 8 weeks ago | 2 months ago | 13 months ago"
    )


def test_line_says_what_when_and_who() -> None:
    told = _memory("Therapy Thursdays 3pm", "preference", "user_explicit", days=15)
    assert line(told, now=NOW) == "- Preference: Therapy Thursdays 3pm (2 weeks ago, you told me)"
    guessed = _memory("Short answers", "fact", "inferred", days=1)
    assert line(guessed, now=NOW) == "- Fact: Short answers (yesterday, inferred)"


def test_user_placement_appends_to_the_last_user_message_only() -> None:
    part = {"type": "text", "text": "second"}
    cases = [("second", "second\n\n" + BLOCK), ([part], [part, {"type": "text", "text": BLOCK}])]
    for last, placed in cases:
        messages = _chat(last)
        before = copy.deepcopy(messages)
        out = inject(messages, LINES, "user")
        assert out == [*before[:4], {"role": "user", "content": placed}]
        assert messages == before  # the input list and its messages are not changed
        assert out[2] is messages[2]  # earlier turns stay byte-identical


def test_system_placement_appends_to_the_first_system_or_developer_message() -> None:
    messages = _chat("second")
    before = copy.deepcopy(messages)
    out = inject(messages, LINES, "system")
    assert out == [{"role": "developer", "content": "Rules.\n\n" + BLOCK}, *before[1:]]
    assert messages == before


def test_nothing_to_place_returns_the_same_list() -> None:
    no_user = [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]
    assert inject(no_user, LINES, "user") is no_user
    chat = _chat("hi")
    assert inject(chat, [], "user") is chat
    no_text = _chat(None)
    assert inject(no_text, LINES, "user") is no_text


def test_system_placement_without_a_system_prompt_uses_the_user_turn() -> None:
    """Else the block went nowhere while the response said it was injected."""
    no_system = [{"role": "user", "content": "hi"}]
    assert inject(no_system, LINES, "system") == inject(no_system, LINES, "user")
    assert inject(no_system, LINES, "system")[0]["content"] == "hi\n\n" + BLOCK
