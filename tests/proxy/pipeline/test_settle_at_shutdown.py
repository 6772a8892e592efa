"""A stream's answer priced in a thread when its final event came (`Recorder.settle`) is
still recorded when the app shuts down before that thread is done."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from ctxbudget.proxy.pipeline import relay
from ctxbudget.proxy.report.store import ReportStore
from tests.fakes import FakeUpstream, chat_chunks
from tests.inproc import proxy_app
from tests.openclaw import openclaw_request


def test_a_stream_priced_in_a_thread_while_the_app_closes_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closing = threading.Event()
    real = relay.billing

    def billing(*args: Any) -> Any:
        closing.wait(10)  # still pricing when the app begins to close
        return real(*args)

    monkeypatch.setattr(relay, "billing_is_quick", lambda *args: False)
    monkeypatch.setattr(relay, "billing", billing)
    fake = FakeUpstream()
    close = fake.close

    async def closed() -> None:
        closing.set()
        await close()

    monkeypatch.setattr(fake, "close", closed)
    with proxy_app(tmp_path, upstream=fake) as (client, _):
        fake.answer_sse(chat_chunks("hi there", usage=True))
        body = openclaw_request(stream=True, model="gpt-4o")
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200
        request_id = r.headers["x-context-budget-request-id"]
    reports = ReportStore(tmp_path / "report.db", run="check")
    try:
        found = reports.request(request_id)
    finally:
        reports.close()
    assert found is not None, "the stream's record was lost at shutdown"
    assert found["costUsd"] is not None  # priced, as the thread priced it
