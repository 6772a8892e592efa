"""Deep recall's LLM rewrite: asked once per query, a failure costs only the rewrite."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from ctxbudget.proxy.config.schema import RewriteConfig
from ctxbudget.proxy.upstream.rewrite import PROMPT, Rewriter

CFG = RewriteConfig(model="openai/mini", api_key_env="REWRITE_KEY", timeout_seconds=0.2)


class _Model:
    def __init__(self, answer: str | Exception, delay: float = 0.0) -> None:
        self.answer, self.delay = answer, delay
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        await asyncio.sleep(self.delay)
        if isinstance(self.answer, Exception):
            raise self.answer
        message = SimpleNamespace(content=self.answer)
        return SimpleNamespace(choices=[SimpleNamespace(message=message)])


def test_words_come_from_the_model_once_per_query() -> None:
    model = _Model("Orion, orion-wave  deploy release!")
    rewriter = Rewriter(model)
    env = {"REWRITE_KEY": "sk-r"}
    first = asyncio.run(rewriter.words("when does orion ship?", CFG, env))
    again = asyncio.run(rewriter.words("when does orion ship?", CFG, env))
    assert first == (["orion", "wave", "deploy", "release"], "LLM rewrite by openai/mini: 4 words")
    assert again == (first[0], "LLM rewrite by openai/mini (cached)")
    assert len(model.calls) == 1
    call = model.calls[0]
    assert call["api_key"] == "sk-r" and call["model"] == "openai/mini"
    assert call["messages"][0] == {"role": "system", "content": PROMPT}
    assert call["messages"][1] == {"role": "user", "content": "when does orion ship?"}


def test_at_most_twelve_words() -> None:
    words, _ = asyncio.run(
        Rewriter(_Model(" ".join(f"w{i}" for i in range(30)))).words("q", CFG, {})
    )
    assert words == [f"w{i}" for i in range(12)]


def test_a_failure_skips_the_rewrite_and_rests_the_model_for_a_minute() -> None:
    now = [100.0]
    model = _Model(RuntimeError("boom"))
    rewriter = Rewriter(model, clock=lambda: now[0])
    assert asyncio.run(rewriter.words("a", CFG, {})) == (
        [],
        "LLM rewrite by openai/mini failed (RuntimeError); offline expansion only",
    )
    now[0] += 30
    assert asyncio.run(rewriter.words("b", CFG, {})) == (
        [],
        "LLM rewrite skipped: openai/mini failed less than a minute ago",
    )
    assert len(model.calls) == 1
    now[0] += 31
    model.answer = "fine"
    assert asyncio.run(rewriter.words("b", CFG, {}))[0] == ["fine"]


def test_a_slow_model_times_out_within_the_configured_seconds() -> None:
    words, note = asyncio.run(Rewriter(_Model("late", delay=1.0)).words("q", CFG, {}))
    assert words == []
    assert note == "LLM rewrite by openai/mini failed (timed out); offline expansion only"
