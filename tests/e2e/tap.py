"""A TCP tap between a real agent and the proxy: it passes every byte on as it comes and keeps
both directions, so a test can compare what the agent sent with what the upstream received,
and what the upstream streamed with what the agent got (the relay byte for byte).

    with Tap(proxy_port) as tap:           # the agent's base URL: tap.root
        ...run the agent...
    for exchange in tap.exchanges():       # each HTTP/1.1 request and its response, in order
        exchange.request_body, exchange.response_body

Only what an agent and uvicorn speak is parsed: `content-length` or chunked bodies, no
compression (the proxy does not compress; a compressed body fails the parse loudly). An agent
may hang up once it has read the last event it needs (Codex does): a stream cut short of its
terminating chunk is taken as it came.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field
from types import TracebackType


@dataclass
class Exchange:
    """One request on a connection and the response to it, bodies de-chunked."""

    method: str
    target: str
    request_headers: dict[str, str]
    request_body: bytes
    status: int
    response_headers: dict[str, str]
    response_body: bytes


@dataclass
class _Connection:
    sent: bytearray = field(default_factory=bytearray)
    """Agent → proxy."""
    received: bytearray = field(default_factory=bytearray)
    """Proxy → agent."""


class Tap:
    """Listens on 127.0.0.1 (an ephemeral port) and forwards each connection to `port`."""

    def __init__(self, port: int) -> None:
        self._target = port
        self._server = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(16)
        self.port = int(self._server.getsockname()[1])
        self.root = f"http://127.0.0.1:{self.port}"
        self.connections: list[_Connection] = []
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> Tap:
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closed = True
        try:
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the accept loop
        except OSError:
            pass
        self._server.close()
        self._threads[0].join(timeout=5)  # no connection is added after this
        with self._lock:
            sockets = list(self._sockets)
            threads = list(self._threads[1:])
        for s in sockets:  # the agent and the proxy are done: end what is still open
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in threads:
            thread.join(timeout=5)
        for s in sockets:
            s.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self._target))
            except OSError:
                client.close()
                continue
            record = _Connection()
            with self._lock:
                self.connections.append(record)
                self._sockets += [client, upstream]
            for source, sink, into in (
                (client, upstream, record.sent),
                (upstream, client, record.received),
            ):
                thread = threading.Thread(target=_pump, args=(source, sink, into), daemon=True)
                thread.start()
                with self._lock:
                    self._threads.append(thread)

    def exchanges(self) -> list[Exchange]:
        """Every request and response that went through, connection by connection."""
        out: list[Exchange] = []
        with self._lock:
            connections = list(self.connections)
        for c in connections:
            requests = _messages(bytes(c.sent), request=True)
            responses = _messages(bytes(c.received), request=False)
            for (start, headers, body), (status, r_headers, r_body) in zip(
                requests, responses, strict=False
            ):
                method, target, _ = start.split(" ", 2)
                out.append(
                    Exchange(
                        method, target, headers, body, int(status.split(" ")[1]), r_headers, r_body
                    )
                )
        return out


def _pump(source: socket.socket, sink: socket.socket, into: bytearray) -> None:
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            into.extend(data)
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for s in (sink, source):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _messages(data: bytes, *, request: bool) -> list[tuple[str, dict[str, str], bytes]]:
    """(start line, headers with lowercase names, body) of each HTTP/1.1 message in `data`."""
    out = []
    at = 0
    while at < len(data):
        end = data.find(b"\r\n\r\n", at)
        if end < 0:
            break
        lines = data[at:end].decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
        at = end + 4
        if "content-encoding" in headers and headers["content-encoding"] != "identity":
            raise ValueError(f"a compressed body: {headers['content-encoding']}")
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = bytearray()
            while True:
                line_end = data.find(b"\r\n", at)
                if line_end < 0:  # the agent hung up after the last event it needed:
                    at = len(data)  # the terminating chunk never came through
                    break
                size = int(data[at:line_end].split(b";")[0], 16)
                at = line_end + 2
                if size == 0:
                    at = data.find(b"\r\n", at) + 2 or len(data)  # no trailers from uvicorn
                    break
                body += data[at : at + size]
                at += size + 2
            out.append((lines[0], headers, bytes(body)))
        elif "content-length" in headers:
            size = int(headers["content-length"])
            out.append((lines[0], headers, data[at : at + size]))
            at += size
        elif request or headers.get("connection", "").lower() != "close":
            out.append((lines[0], headers, b""))
        else:  # read to the end of the connection
            out.append((lines[0], headers, data[at:]))
            at = len(data)
    return out
