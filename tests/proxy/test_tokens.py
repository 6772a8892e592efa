from __future__ import annotations

from proxy.tokens import TokenCounter, encoding_name


def test_tokens_are_counted_offline_with_the_models_encoding() -> None:
    counter = TokenCounter()
    assert counter.count("hello world", "o200k_base") == 2
    assert counter.count("", "o200k_base") == 0
    assert encoding_name("gpt-4o", "o200k_base") == "o200k_base"
    assert encoding_name("openai/gpt-4", "o200k_base") == "cl100k_base"
    assert encoding_name("mock-model", "o200k_base") == "o200k_base"
    assert counter.count("hello world", "cl100k_base") == 2
