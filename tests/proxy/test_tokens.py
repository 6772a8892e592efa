from __future__ import annotations

from ctxbudget.proxy.tokens import OBJECTS_WEIGHT, TokenCounter, encoding_name
from tests.held import SLACK, held


def test_tokens_are_counted_offline_with_the_models_encoding() -> None:
    counter = TokenCounter()
    assert counter.count("hello world", "o200k_base") == 2
    assert counter.count("", "o200k_base") == 0
    assert encoding_name("gpt-4o", "o200k_base") == "o200k_base"
    assert encoding_name("openai/gpt-4", "o200k_base") == "cl100k_base"
    assert encoding_name("mock-model", "o200k_base") == "o200k_base"
    assert counter.count("hello world", "cl100k_base") == 2


def test_a_huge_text_is_counted_in_pieces_to_the_same_total() -> None:
    from ctxbudget.proxy.tokens import PIECE_CHARS, _count, _encoding

    enc = _encoding("o200k_base")
    texts = [
        ("A paragraph of a fetched page, with words.\n\n" * 12_000),
        ("héllo wörld — 中文 " * 20_000 + "x" * (PIECE_CHARS + 7)),  # a run with nowhere to cut
    ]
    for text in texts:
        assert len(text) > 2 * PIECE_CHARS
        assert _count(enc, text) == len(enc.encode_ordinary(text))


def test_a_block_counted_by_identity_has_its_own_count_and_the_kept_bytes_are_bounded() -> None:
    """`count_bytes` finds a large block it counted by the object (no hashing of its bytes
    again): never another object's or another encoding's count, and what it keeps for that
    stays bounded."""
    counter, fresh = TokenCounter(), TokenCounter()

    def expected(data: bytes, encoding: str) -> int:
        return fresh.count_bytes(bytes(bytearray(data)), encoding)

    blocks = [("héllo " * (1000 + 97 * i) + str(i)).encode() for i in range(40)]
    for _ in range(2):
        for data in blocks:
            for encoding in ("o200k_base", "cl100k_base"):
                assert counter.count_bytes(data, encoding) == expected(data, encoding)
    block = b"word " * 40_000
    count = expected(block, "o200k_base")
    with held() as kept:
        for _ in range(200):  # 200 new 200 KB blocks (equal: counted once), each gone after
            data = block[:-1] + block[-1:]  # an object of its own, made here
            assert counter.count_bytes(data, "o200k_base") == count
        del data
    assert kept.bytes <= OBJECTS_WEIGHT + SLACK  # not the 40 MB they came to


def test_a_segment_counted_by_identity_has_its_own_saving_in_each_encoding() -> None:
    from ctxbudget.caps import Segment

    counter, fresh = TokenCounter(), TokenCounter()
    segments = [
        Segment(
            kind="tool_output",
            label=f"t{i}",
            before=5000 + i,
            after=10,
            action="clamped",
            cap=10,
            original="héllo wörld " * (400 + i),
            clamped="héllo",
        )  # fmt: skip
        for i in range(30)
    ]
    for _ in range(2):
        for s in segments:
            for encoding in ("o200k_base", "cl100k_base"):
                expected = fresh.count(s.original, encoding) - fresh.count(s.clamped, encoding)
                assert counter.saved(s, encoding) == expected
    with held() as kept:
        for _ in range(40):  # 40 segments of 600 KB each (300,000 characters), equal texts
            # counted once (by the text's hash), but each segment holds a string of its own
            counter.saved(Segment(kind="tool_output", label="t", before=9, after=1,
                                  action="clamped", cap=1, original="中" * 300_000,
                                  clamped="x"), "o200k_base")  # fmt: skip
    assert kept.bytes <= OBJECTS_WEIGHT + SLACK


def test_what_the_counter_keeps_of_segments_is_bounded_by_all_they_hold() -> None:
    """A segment kept by identity keeps all its strings alive, not only the two texts it
    is counted by: a client's long call id or URL (and text of 4-byte characters) count
    toward the bound too (64 segments with a 1 MB URL each held 64 MB)."""
    import gc
    import tracemalloc

    from ctxbudget.caps import Segment

    counter = TokenCounter()
    counter.count("warm", "o200k_base")
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(64):
            s = Segment(
                kind="web_fetch", label=f"t{i}", before=5000, after=10, action="clamped",
                cap=10, url="https://example.com/" + "a" * (1 << 20) + str(i),
                original=f"{i} " + "word " * 1000, clamped="word",
            )  # fmt: skip
            counter.saved(s, "o200k_base")
            del s
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept <= OBJECTS_WEIGHT + (2 << 20)
