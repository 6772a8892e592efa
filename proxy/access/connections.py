"""The HTTP protocol `serve` runs: uvicorn's own, with a clock on clients that are slow to send
a request, and a cap on the connections one peer holds at once (`proxy.limits`, issue 35).

uvicorn closes an idle keep-alive connection after a response, and nothing else: a connection
that never sends a whole request, or trickles its body, it keeps for good. 1,100 of them, each
sending a byte every 5 s, held every file a 1,024-file process may open. Here:

- **idle**: a new connection that sends nothing is closed after `keepAliveTimeoutSeconds`,
  quietly, as uvicorn closes an idle one after a response;
- **headers**: the request line and headers must arrive within `headerTimeoutSeconds` of their
  first byte, else 408;
- **body**: it may take `bodyTimeoutSeconds`, plus a second for every `bodyMinBytesPerSecond`
  bytes received: a deadline that progress moves, so a steady upload of any size is never
  cut and a trickle is (408). Time the app is not reading (its buffer full, or `100-continue`
  not sent yet) is not the client's: the clock starts again when the app reads;
- **after the body**: nothing here times the connection. The app's work and its answer (an SSE
  relay can last many minutes) are never cut;
- **per peer**: a connection that makes its address hold more than `maxConnectionsPerClient`
  in this worker gets 503 at once and is closed when its request arrives (or after 1 s).

A 408 or 503 is written here, in the path's wire format (`proxy.wire.for_path`), since the app
has nothing to answer with: headers not complete, or a body its `receive()` still waits for
(that wait ends as a disconnect, and whatever the app answers goes nowhere).
"""

from __future__ import annotations

import asyncio
import logging
from http import HTTPStatus
from typing import Any, Literal

import orjson
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from ctxbudget.proxy.config.schema import LimitsConfig
from ctxbudget.proxy.errors import (
    BadRequest,
    CtxBudgetError,
    RequestTimeout,
    TooManyConnections,
)
from ctxbudget.proxy.wire import for_path

log = logging.getLogger("ctxbudget.connections")

LINGER_SECONDS = 1.0
"""How long a refused connection stays open for its request to arrive, so that the client
reads the 503 instead of a reset."""

_FIRST_LINE = 2048
"""Bytes of a request kept while its headers arrive: enough for the path in its first line."""

Phase = Literal["idle", "headers", "body", "app", "refused"]


class _Clocked(asyncio.Protocol):
    """What each HTTP protocol class of uvicorn's gets here (mixed in before it)."""

    limits: LimitsConfig
    # uvicorn's, in both of its HTTP protocols
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    client: tuple[str, int] | None
    connections: set[Any]
    cycle: Any
    flow: Any

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._phase: Phase = "idle"
        self._timer: asyncio.TimerHandle | None = None
        self._since = self.loop.time()
        self._received = 0
        self._head = b""
        self._seen: Any = None
        cap = self.limits.max_connections_per_client
        if cap is not None and self.client is not None and self._held(self.client[0]) > cap:
            self._refuse(self.client[0], cap)
            return
        self._arm(self._since + self.limits.keep_alive_timeout_seconds)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._phase == "refused":
            self.transport.close()  # its request is read: the 503 goes out before the close
            return
        if self._phase in ("idle", "app") and (self.cycle is None or self.cycle.response_complete):
            self._start("headers")  # the first byte of a request
            self._seen = self.cycle
            self._arm_for_headers()
        if self._phase == "headers" and len(self._head) < _FIRST_LINE:
            self._head += data[: _FIRST_LINE - len(self._head)]
        elif self._phase == "body":
            self._received += len(data)
        super().data_received(data)
        cycle = self.cycle
        if self._phase == "headers" and cycle is not None and cycle is not self._seen:
            self._head = b""
            if cycle.more_body and not cycle.response_started:
                self._start("body")
                self._arm_for_body()
            else:
                self._start("app")
        elif self._phase == "body" and (not cycle.more_body or cycle.response_started):
            self._start("app")

    def _held(self, peer: str) -> int:
        """Connections open from `peer` in this worker, this one included (uvicorn's own set
        of them, WebSocket ones too)."""
        return sum(1 for c in self.connections if (getattr(c, "client", None) or ("",))[0] == peer)

    def _start(self, phase: Phase) -> None:
        self._disarm()
        self._phase = phase
        self._since = self.loop.time()
        self._received = 0

    def _arm(self, when: float) -> None:
        self._disarm()
        self._timer = self.loop.call_at(when, self._check)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm_for_headers(self) -> None:
        if self.limits.header_timeout_seconds is not None:
            self._arm(self._since + self.limits.header_timeout_seconds)

    def _arm_for_body(self) -> None:
        if self.limits.body_timeout_seconds is not None:
            self._arm(self._body_deadline(self.limits.body_timeout_seconds))

    def _body_deadline(self, timeout: float) -> float:
        rate = self.limits.body_min_bytes_per_second
        return self._since + timeout + (self._received / rate if rate else 0.0)

    def _check(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self.transport.get_protocol() is not self:
            return  # closed, or handed to a WebSocket protocol
        if self._phase in ("idle", "refused"):
            self.transport.close()
        elif self._phase == "headers":
            took = self.limits.header_timeout_seconds
            self._answer(
                RequestTimeout(
                    f"the request's headers did not arrive within {took:g} s "
                    "(proxy.limits.headerTimeoutSeconds); send the whole request at once"
                ),
                _path(self._head),
            )
        elif self._phase == "body":
            self._check_body()

    def _check_body(self) -> None:
        cycle, timeout = self.cycle, self.limits.body_timeout_seconds
        if timeout is None or not cycle.more_body or cycle.response_started:
            self._start("app")
            return
        if self.flow.read_paused or cycle.waiting_for_100_continue:
            # the app has not read what came, or not asked for the body yet: not the client's
            # time, so the client's clock starts again
            self._start("body")
            self._arm_for_body()
            return
        deadline = self._body_deadline(timeout)
        now = self.loop.time()
        if now < deadline:
            self._arm(deadline)
            return
        took, got = now - self._since, self._received
        # the app's receive() ends as a disconnect, and what it answers goes nowhere: this
        # is the answer
        cycle.disconnected = True
        cycle.message_event.set()
        self._answer(
            RequestTimeout(
                f"the request body arrived too slowly: {got} bytes in {took:.0f} s (at most "
                f"{timeout:g} s plus 1 s per {self.limits.body_min_bytes_per_second} bytes: "
                "proxy.limits.bodyTimeoutSeconds, bodyMinBytesPerSecond)"
            ),
            cycle.scope.get("path", "/"),
        )

    def _refuse(self, peer: str, cap: int) -> None:
        self._phase = "refused"
        # not one of the peer's connections any more: only the ones it is served on count
        self.connections.discard(self)
        error = TooManyConnections(
            f"too many connections from {peer}: at most {cap} at once "
            "(proxy.limits.maxConnectionsPerClient); retry when one of them is done"
        )
        error.headers["retry-after"] = "1"
        self.transport.write(_response(error, "/"))
        self._arm(self.loop.time() + LINGER_SECONDS)

    def send_400_response(self, msg: str) -> None:
        # uvicorn's answer to a request its parser refuses (a header with no colon, a bad
        # content-length, a URL past the parser's limit) was its own plain text, which no SDK
        # reads as an error: the path's wire format instead, as for a 408
        self._answer(
            BadRequest(
                "the request is not valid HTTP/1.1 (its request line or a header could not be "
                "parsed, or is too long)"
            ),
            _path(self._head),
        )

    def _answer(self, error: CtxBudgetError, path: str) -> None:
        peer = self.client[0] if self.client else "?"
        log.info("closed a connection from %s: %s", peer, error.message)
        self._phase = "refused"
        self.transport.write(_response(error, path))
        self.transport.close()


def _path(head: bytes) -> str:
    """The path in a request's first line, as far as it has arrived ("/" before it has)."""
    parts = head.split(b"\r\n", 1)[0].split(b" ")
    if len(parts) == 2 and b"?" in parts[1]:  # the path is whole: only its query is cut
        return parts[1].split(b"?", 1)[0].decode("latin-1")
    if len(parts) < 3:  # the whole target has not arrived, or this is not HTTP
        return "/"
    return parts[1].split(b"?", 1)[0].decode("latin-1")


def _response(error: CtxBudgetError, path: str) -> bytes:
    """A whole HTTP/1.1 answer carrying `error`, that closes the connection."""
    body = orjson.dumps(for_path(path).error_body(error))
    lines = [
        f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
        *(f"{name}: {value}" for name, value in error.headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class _H11(_Clocked, H11Protocol):
    pass


try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # uvicorn's "auto" falls back to h11 without httptools: so do we
    _PROTOCOL: type[_Clocked] = _H11
else:

    class _HttpTools(_Clocked, HttpToolsProtocol):
        pass

    _PROTOCOL = _HttpTools


class GuardedHTTP:
    """What `serve` gives uvicorn as its HTTP protocol class (`uvicorn.run(http=...)`):
    uvicorn calls it as it would the class, and it makes uvicorn's own ("auto": httptools,
    else h11) with the clock and the cap of `limits`. A plain object, so that uvicorn can
    hand it to each worker process (pickled)."""

    def __init__(self, limits: LimitsConfig) -> None:
        self.limits = limits

    def __call__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> asyncio.Protocol:
        protocol = _PROTOCOL(  # type: ignore[call-arg]
            config=config, server_state=server_state, app_state=app_state, _loop=_loop
        )
        protocol.limits = self.limits
        return protocol
