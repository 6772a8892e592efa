"""When a streamed answer counts as delivered: a client that hangs up once it has the answer's
final event (Codex closes as soon as `response.completed` arrives, before the upstream has
closed its end) got the whole answer, and its request is recorded as completed, not as 499."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from ctxbudget.proxy.pipeline.relay import CLIENT_GONE, relay
from ctxbudget.proxy.wire.chat import ChatCompletions

CHAT = [b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n', b"data: [DONE]\n\n"]
MESSAGES = [
    b'event: content_block_delta\ndata: {"type":"content_block_delta"}\n\n',
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
]
RESPONSES = [
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta"}\n\n',
    b'event: response.completed\ndata: {"type":"response.completed","response":{}}\n\n',
]


class Reply:
    """An upstream stream that sends `chunks`, then stays open (it has not closed its end)."""

    status = 200
    headers: dict[str, str] = {}

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.closed = self.released = False

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        await asyncio.Event().wait()

    def close(self) -> None:
        self.closed = True

    def release(self) -> None:
        self.released = True


class Recorder:
    usage = None

    def __init__(self) -> None:
        self.finished: list[tuple[int, str | None]] = []

    def finish(self, status: int, *, upstream_error: str | None = None) -> None:
        self.finished.append((status, upstream_error))

    def settle(self) -> None:
        """The final event came (the real one prices the answer here)."""


async def _client_takes(chunks: list[bytes], count: int, *, split: bool = False) -> Recorder:
    """The client reads `count` chunks of a stream of `chunks`, then hangs up."""
    if split:  # every chunk cut in two: the final event arrives in pieces
        chunks = [part for c in chunks for part in (c[: len(c) // 2], c[len(c) // 2 :])]
        count *= 2
    recorder = Recorder()
    reply = Reply(chunks)
    stream = relay(reply, recorder, ChatCompletions())  # type: ignore[arg-type]
    got = [await anext(stream) for _ in range(count)]
    assert got == chunks[:count]
    # As the server does: having sent a chunk it asks for the next; the client hangs up (here
    # while the relay waits for the upstream, or has a chunk the client will never get), and
    # the server cancels it.
    waiting = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    await stream.aclose()
    assert reply.closed  # the upstream connection, half read, is not reused
    return recorder


@pytest.mark.parametrize(
    "chunks", [CHAT, MESSAGES, RESPONSES], ids=["chat", "messages", "responses"]
)
@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
def test_a_client_gone_after_the_final_event_got_its_answer(
    chunks: list[bytes], split: bool
) -> None:
    recorder = asyncio.run(_client_takes(chunks, 2, split=split))
    assert recorder.finished == [(200, None)]


@pytest.mark.parametrize(
    "chunks", [CHAT, MESSAGES, RESPONSES], ids=["chat", "messages", "responses"]
)
def test_a_client_gone_before_the_final_event_is_recorded_as_gone(chunks: list[bytes]) -> None:
    recorder = asyncio.run(_client_takes(chunks, 1))
    assert recorder.finished == [(CLIENT_GONE, "client disconnected")]


def test_the_final_event_quoted_in_the_answer_text_does_not_count() -> None:
    text = b'data: {"choices":[{"delta":{"content":"say \\"message_stop\\"\\ndata: [DONE]"}}]}\n\n'
    recorder = asyncio.run(_client_takes([text, *CHAT], 1))
    assert recorder.finished == [(CLIENT_GONE, "client disconnected")]
