"""A client that gives up cancels the upstream request (issue 10, item 6).

Driven through the ASGI interface directly, as a server would: the body arrives, then, while
the proxy waits for the upstream, the server says the client disconnected.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson

from ctxbudget.proxy.app import create_app
from ctxbudget.proxy.config.schema import ConfigSource
from tests.fakes import FakeUpstream
from tests.inproc import config_for

BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


async def _abandon(app: Any, *, after: float) -> list[dict[str, Any]]:
    """POST BODY to the app; the client disconnects `after` seconds later."""
    gone = asyncio.Event()
    sent_body = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": BODY, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    out: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        out.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1:4141"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 4141),
    }
    asyncio.get_running_loop().call_later(after, gone.set)
    await app(scope, receive, send)
    return out


def test_the_upstream_request_is_cancelled_when_the_client_leaves(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(orjson.dumps(config_for(tmp_path)).decode())
    fake = FakeUpstream(hang=True)
    app = create_app(ConfigSource(path, {}, {}), upstream=fake, env={}, run="t")

    async def run() -> tuple[float, list[dict[str, Any]], dict[str, Any]]:
        async with app.router.lifespan_context(app):
            started = time.monotonic()
            out = await asyncio.wait_for(_abandon(app, after=0.2), 10)
            took = time.monotonic() - started
            state = app.state.proxy
            await asyncio.to_thread(state.reports.flush)
            summary = state.reports.summary(recent=5)
        return took, out, summary

    took, out, summary = asyncio.run(run())
    assert fake.cancelled == 1
    assert took < 2  # not the 600 s read timeout
    assert out[0]["status"] == 499
    recent = summary["recent"][0]
    assert recent["status"] == 499
    assert recent["upstreamError"] == "client disconnected before the answer"
