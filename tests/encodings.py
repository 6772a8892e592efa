"""tiktoken's `encode_ordinary`, remembered for the whole run.

Each test builds its own app, and with it a `TokenCounter` that starts empty (its cache is the
app's, by owner): the recorded sessions and the OpenClaw workloads that dozens of tests replay
were encoded again by each one, ~5 of the ~9 s the in-process layer spent in tiktoken. The
token ids of a text are a pure function of the text and the encoding, so the run keeps them:
every count, every cache hit and miss of the app's own counter, and every call a test counts
(`encode_ordinary` wrapped again on top of this) are as before; only the BPE work is not
done twice.

Nothing is kept while tracemalloc traces (`tests/held.py` measures what the app holds: a text
remembered here would count as held), and the ids of a text are handed out as a new list.
"""

from __future__ import annotations

import tracemalloc
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import tiktoken
import xxhash

KEEP_BYTES = 48 << 20
"""Token ids kept at most (4 bytes each); past it the memo starts again empty."""
LONGEST = 1 << 20
"""Texts longer than this (in characters) are encoded each time: few, and each a large entry."""


def _remembering(encode: Callable[[Any, str], list[int]]) -> Callable[[Any, str], list[int]]:
    kept: dict[tuple[str, int, bytes], array[int]] = {}
    weight = [0]

    def encode_ordinary(self: Any, text: str) -> list[int]:
        if len(text) > LONGEST:
            return encode(self, text)
        # the text's own bytes name it (a 128-bit digest, lone surrogates included): holding
        # the texts themselves would keep every tool result the run sent
        key = (self.name, len(text), xxhash.xxh3_128_digest(text.encode("utf-8", "surrogatepass")))
        found = kept.get(key)
        if found is not None:
            return found.tolist()
        ids = encode(self, text)
        if not tracemalloc.is_tracing():
            if weight[0] > KEEP_BYTES:
                kept.clear()
                weight[0] = 0
            kept[key] = array("I", ids)
            weight[0] += 4 * len(ids)
        return ids

    return encode_ordinary


@contextmanager
def remembered_encodings() -> Iterator[None]:
    """tiktoken's `Encoding.encode_ordinary` remembering what it encoded, until the exit."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            tiktoken.Encoding,
            "encode_ordinary",
            _remembering(tiktoken.Encoding.encode_ordinary),
        )
        yield
