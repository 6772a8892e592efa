from __future__ import annotations

import pytest

from memory.query import user_turn
from proxy.pipeline.chat_command import find_command

INTERNAL = {
    "role": "user",
    "content": [
        {
            "type": "text",
            "text": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nx\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>",
        }
    ],
}


@pytest.mark.parametrize(
    ("messages", "mode"),
    [
        ([{"role": "user", "content": "/context budget"}], "text"),
        ([{"role": "user", "content": "  /context   budget  json "}], "json"),
        ([{"role": "user", "content": [{"type": "text", "text": "/context budget"}]}], "text"),
        (
            [
                {
                    "role": "user",
                    "content": "[Sun 2026-11-22 11:28 UTC] /context budget\n\n"
                    "Runtime: agent=main | host=vm",
                },
                INTERNAL,
            ],
            "text",
        ),
        ([{"role": "user", "content": "/context budgets"}], None),
        ([{"role": "user", "content": "what does /context budget do?"}], None),
        ([{"role": "user", "content": "/context budget\nand more"}], None),
        (
            [{"role": "user", "content": "/context budget"}, {"role": "assistant", "content": "x"}],
            None,
        ),
        ([{"role": "user", "content": "/ctxbudget"}], "text"),
        ([{"role": "user", "content": "/ctxbudget json"}], "json"),
        ([{"role": "user", "content": "/ctxbudget now"}], None),
        ([], None),
    ],
)
def test_command_is_found_only_in_the_latest_real_user_text(
    messages: list[dict[str, object]], mode: str | None
) -> None:
    assert find_command(user_turn(messages)) == mode
