"""What one key sent cannot be timed by another (issue 35, item 6): every cache found by a
value (a text, bytes, their digest) is keyed by owner too, so key B's request for a text key A
sent does the work again, as for a text no one sent; the same key's next request still hits.

The work is counted where it happens, by wrapping the dependency that does it: the bootstrap
clamp (`ctxbudget.caps.bootstrap.clamp_body`) and tiktoken's encoder."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tiktoken

import ctxbudget.caps.bootstrap
from tests.inproc import InProcess, proxy_app, state_of
from tests.openclaw import openclaw_request

ENV = {"CTXBUDGET_PROXY_KEYS": "alice=ka-1,bob=kb-2"}
ALICE, BOB = {"authorization": "Bearer ka-1"}, {"authorization": "Bearer kb-2"}
MARK = "UNIQUE-OWNER-CACHE-MARK"


def _body() -> dict[str, Any]:
    body = openclaw_request(stream=False)
    body["messages"][0]["content"] = body["messages"][0]["content"].replace(
        "TAIL-OF-AGENTS", "TAIL-OF-AGENTS " + MARK
    )
    return body


class _Calls:
    """Calls of a wrapped function whose arguments hold `MARK`."""

    def __init__(self) -> None:
        self.n = 0
        self._lock = threading.Lock()

    def wrap(self, function: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if any(isinstance(a, str) and MARK in a for a in args):
                with self._lock:
                    self.n += 1
            return function(*args, **kwargs)

        return counted


def _send(client: InProcess, headers: dict[str, str]) -> None:
    r = client.post("/v1/chat/completions", json=_body(), headers=headers)
    assert r.status_code == 200, r.text
    assert int(r.headers["x-context-budget-clamped"]) > 0


def _written(client: InProcess, n: int) -> None:
    """Wait for the report's writer (it counts the segments' tokens) to have `n` records."""
    reports = state_of(client).reports
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        reports.flush()
        if reports.summary(recent=0)["totals"]["requests"] >= n:
            return
        time.sleep(0.02)
    raise AssertionError("the report writer did not write")


def test_a_clamp_another_key_made_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clamps = _Calls()
    monkeypatch.setattr(
        ctxbudget.caps.bootstrap, "clamp_body", clamps.wrap(ctxbudget.caps.bootstrap.clamp_body)
    )
    with proxy_app(tmp_path, env=ENV) as (client, _):
        _send(client, ALICE)
        assert clamps.n == 1
        _send(client, ALICE)
        assert clamps.n == 1  # the same owner: found again
        _send(client, BOB)
        assert clamps.n == 2  # another owner: made again, as for a text no one sent
        _send(client, BOB)
        assert clamps.n == 2


def test_a_token_count_another_key_made_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    encodes = _Calls()
    monkeypatch.setattr(
        tiktoken.Encoding, "encode_ordinary", encodes.wrap(tiktoken.Encoding.encode_ordinary)
    )
    with proxy_app(tmp_path, env=ENV) as (client, _):
        _send(client, ALICE)
        _written(client, 1)
        alice = encodes.n
        assert alice > 0
        _send(client, ALICE)
        _written(client, 2)
        assert encodes.n == alice  # the same owner: counted once
        _send(client, BOB)
        _written(client, 3)
        assert encodes.n == 2 * alice  # another owner: counted again


def test_a_clamp_another_app_made_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the clamps remember is the app's (`ProxyState.memo`, built in `create_app` and
    closed with it), never the process's: a second app, the same key and text, clamps again."""
    clamps = _Calls()
    monkeypatch.setattr(
        ctxbudget.caps.bootstrap, "clamp_body", clamps.wrap(ctxbudget.caps.bootstrap.clamp_body)
    )
    for name in ("one", "two", "three"):
        (tmp_path / name).mkdir()
    with proxy_app(tmp_path / "one", env=ENV) as (first, _):
        _send(first, ALICE)
        assert clamps.n == 1
        with proxy_app(tmp_path / "two", env=ENV) as (second, _):
            _send(second, ALICE)
            assert clamps.n == 2  # another app: made again
            _send(second, ALICE)
            _send(first, ALICE)
            assert clamps.n == 2  # each app finds its own again
    with proxy_app(tmp_path / "three", env=ENV) as (third, _):
        _send(third, ALICE)
        assert clamps.n == 3  # one made after both closed: nothing of theirs is left
