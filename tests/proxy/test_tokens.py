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


def test_a_huge_text_is_counted_in_pieces_to_the_same_total() -> None:
    from proxy.tokens import PIECE_CHARS, _count, _encoding

    enc = _encoding("o200k_base")
    texts = [
        ("A paragraph of a fetched page, with words.\n\n" * 12_000),
        ("héllo wörld — 中文 " * 20_000 + "x" * (PIECE_CHARS + 7)),  # a run with nowhere to cut
    ]
    for text in texts:
        assert len(text) > 2 * PIECE_CHARS
        assert _count(enc, text) == len(enc.encode_ordinary(text))
