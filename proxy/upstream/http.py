"""The upstream: what the pipeline needs of it (`UpstreamClient`), and the aiohttp client.

The pipeline sees two Protocols: an `UpstreamClient` that sends one request, and the
`UpstreamReply` it gets back (status and headers first, then the body read whole or relayed
chunk by chunk). `HttpUpstream` is the real one: one shared, pooled aiohttp session. Tests
replay canned answers through the same Protocols (`tests/fakes.py`), and litellm routes answer
with their own `UpstreamReply` (`proxy/upstream/litellm.py`).

aiohttp rather than httpx because it measured faster on this exact path: relaying a 170 KB
chat request to a local upstream, 0.77 ms vs 1.2 ms median at concurrency 1 and 2,550 vs
600 requests/s at concurrency 32 (see docs/benchmarks.md).

Response bodies are relayed as the upstream sent them (no decompression), chunk by chunk as
they arrive for SSE, so streaming stays intact and nothing is buffered whole.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import aiohttp.abc
import aiohttp.payload
import orjson
from yarl import URL

from ctxbudget.proxy.errors import UpstreamError
from ctxbudget.proxy.urls import basic_auth, redact

# Hop-by-hop headers (RFC 9110 §7.6.1) and ones we set ourselves are never copied across.
_DROP_REQUEST = frozenset(
    {
        "host",
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "content-length",
        "authorization",
        "proxy-authorization",
    }
)
_DROP_RESPONSE = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "trailer",
        "upgrade",
        # the server that answers the client (uvicorn) sets its own: not two of each
        "server",
        "date",
    }
)


def forward_request_headers(
    headers: Mapping[str, str], authorization: str | None
) -> dict[str, str]:
    """Client headers to send upstream, with `authorization` set (or dropped when None)."""
    out = {
        k: v
        for k, v in headers.items()
        if (name := k.lower()) not in _DROP_REQUEST and not name.startswith("x-context-budget")
    }
    if authorization:
        out["authorization"] = authorization
    return out


def response_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Upstream response headers to pass back to the client."""
    return {k: v for k, v in headers.items() if k.lower() not in _DROP_RESPONSE}


class Parts:
    """A request body in pieces (bytes, or views of them), sent as they are.

    A conversation's request at turn 300 is ~1 MB, of which a turn adds ~3 KB: the body
    forwarded is the last one's list as it was (views of the buffers it went in) and the new
    items' bytes. Joined, each request copied the whole body into a new buffer (~100 µs at
    1 MB, most of it the new pages' faults) that the socket then copied again; sent in pieces,
    only the socket copies it. `bytes(parts)` joins them (what the worker hands back, what a
    test reads).

    >>> parts = Parts((b'{"a":', memoryview(b"[1,2,3]")[:4], b"]}"))
    >>> len(parts), bytes(parts), parts == b'{"a":[1,2]}'
    (11, b'{"a":[1,2]}', True)
    """

    __slots__ = ("pieces", "size")

    def __init__(self, pieces: Sequence[Any]) -> None:
        self.pieces = tuple(pieces)
        """Each a bytes-like object of single bytes (bytes, memoryview, `msgspec.Raw`)."""
        self.size = sum(map(len, self.pieces))

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        return b"".join(self.pieces)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Parts):
            other = bytes(other)
        if isinstance(other, (bytes, bytearray, memoryview)):
            return len(other) == self.size and bytes(self) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to bytes, which hash otherwise

    def writes(self, smallest: int = 64 << 10) -> Iterator[Any]:
        """The pieces to write, each under `smallest` bytes joined with its neighbours: one
        socket write for the short fields between the large views, not one each."""
        short: list[Any] = []
        held = 0
        for piece in self.pieces:
            if len(piece) >= smallest:
                if short:
                    yield b"".join(short)
                    short, held = [], 0
                # asyncio's transports take bytes, bytearray or memoryview only (a client's
                # raw field, `msgspec.Raw`, is a buffer of another type)
                yield piece if isinstance(piece, bytes | memoryview) else memoryview(piece)
                continue
            short.append(piece)
            held += len(piece)
            if held >= smallest:
                yield b"".join(short)
                short, held = [], 0
        if short:
            yield b"".join(short)


Body = bytes | Parts
"""A request body for the upstream: whole, or in `Parts`."""


class _PartsPayload(aiohttp.payload.Payload):
    """`Parts` as aiohttp sends a body: sized (a `Content-Length`, never chunked), written
    piece by piece."""

    _value: Parts

    def __init__(self, value: Parts) -> None:
        super().__init__(value, content_type="application/octet-stream")  # as for bytes
        self._size = value.size

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return bytes(self._value).decode(encoding, errors)

    async def as_bytes(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return bytes(self._value)

    async def write(self, writer: aiohttp.abc.AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(
        self, writer: aiohttp.abc.AbstractStreamWriter, content_length: int | None
    ) -> None:
        left = content_length
        for piece in self._value.writes():
            if left is not None:
                if left <= 0:
                    return
                piece = memoryview(piece)[:left]
                left -= len(piece)
            await writer.write(piece)


def _data(body: Body | None) -> Any:
    """`body` as aiohttp's `data=`: a new payload for each attempt."""
    return _PartsPayload(body) if isinstance(body, Parts) else body


class UpstreamReply(Protocol):
    """An upstream answer whose status was 2xx; the body is still unread.

    Read it once: `read()` whole, or `iter_chunks()` as it arrives. After streaming, call
    `release()` when the body was read to its end, else `close()` (a half-read connection
    cannot be reused).
    """

    status: int
    headers: dict[str, str]
    """Response headers to pass on (hop-by-hop ones already dropped)."""

    async def read(self) -> bytes: ...

    def iter_chunks(self) -> AsyncIterator[bytes]: ...

    def close(self) -> None: ...

    def release(self) -> None: ...


class UpstreamClient(Protocol):
    """Sends requests upstream; owned by the app's lifespan."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def request(
        self,
        method: str,
        url: str,
        *,
        body: Body | None,
        headers: Mapping[str, str],
        connect_timeout: float,
        read_timeout: float,
    ) -> UpstreamReply:
        """Send a request (`body` whole, or in `Parts`); raise `UpstreamError` for transport
        failures and non-2xx answers (with the upstream's status, and its body when it is an
        error object)."""
        ...


@dataclass
class HttpResponse:
    """`UpstreamReply` of an aiohttp response."""

    status: int
    headers: dict[str, str]
    _response: aiohttp.ClientResponse

    async def read(self) -> bytes:
        try:
            return await self._response.read()
        finally:
            self._response.release()

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """Yield body bytes as they arrive."""
        async for chunk in self._response.content.iter_any():
            yield chunk

    def close(self) -> None:
        """Close the connection (a stream the client abandoned is not reusable)."""
        self._response.close()

    def release(self) -> None:
        """Return a fully read connection to the pool."""
        self._response.release()


class HttpUpstream:
    """`UpstreamClient` over HTTP: one pooled aiohttp session, owned by the app lifespan."""

    def __init__(self, *, max_connections: int = 512) -> None:
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections, ttl_dns_cache=300, enable_cleanup_closed=True
            )
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",)
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        url: str,
        *,
        body: Body | None,
        headers: Mapping[str, str],
        connect_timeout: float,
        read_timeout: float,
    ) -> HttpResponse:
        """Send a request; raise `UpstreamError` for transport failures and non-2xx answers."""
        if self._session is None:
            await self.start()
        if self._session is None:  # for the type checker: start() always sets it
            raise UpstreamError("upstream client is not running")
        # User info in the base URL is HTTP Basic for a request with no credential header of
        # its own; aiohttp refuses both at once (every request was a 500), and a request's
        # own `Authorization` (the upstream key, or the client's) is the one meant.
        sent, basic = basic_auth(url)
        headers = dict(headers)
        if basic is not None and not any(k.lower() == "authorization" for k in headers):
            headers["authorization"] = basic
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=connect_timeout,
            sock_connect=connect_timeout,
            sock_read=read_timeout,
        )
        try:
            try:
                resp = await self._session.request(
                    method, sent, data=_data(body), headers=headers, timeout=timeout
                )
            except aiohttp.ServerDisconnectedError:
                # A pooled connection the server closed while idle (its keep-alive ran out,
                # uvicorn's after 5 s) is found closed only when written to: the server never
                # read the request. Once more, on a fresh connection; a second disconnect is
                # the server's answer.
                resp = await self._session.request(
                    method, sent, data=_data(body), headers=headers, timeout=timeout
                )
        except aiohttp.ConnectionTimeoutError as exc:
            raise UpstreamError(
                f"upstream {redact(url)} did not accept a connection within "
                f"{connect_timeout:g} s (proxy.upstream.connectTimeoutSeconds)",
                status=502,
                code="upstream_unreachable",
            ) from exc
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise UpstreamError(
                f"upstream {redact(url)} did not answer within {read_timeout:g} s "
                "(proxy.upstream.readTimeoutSeconds)",
                status=504,
                code="upstream_timeout",
            ) from exc
        except aiohttp.InvalidURL as exc:
            raise UpstreamError(
                f"upstream URL {redact(url)!r} is not valid: check proxy.upstream.baseUrl",
                status=502,
                code="upstream_unreachable",
            ) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError(
                f"upstream {redact(url)} is unreachable: {exc.__class__.__name__}: "
                f"{_without(str(exc), url, sent)}",
                status=502,
                code="upstream_unreachable",
            ) from exc
        headers_out = response_headers(resp.headers)
        if resp.status >= 400:
            raise await _upstream_failure(resp, url, headers_out)
        return HttpResponse(status=resp.status, headers=headers_out, _response=resp)


def _without(message: str, *urls: str) -> str:
    """`message` with each of `urls`, as given or as aiohttp spells it, redacted."""
    for url in urls:
        for spelled in {url, _spelled(url)}:
            if spelled:
                message = message.replace(spelled, redact(spelled))
    return message


def _spelled(url: str) -> str:
    try:
        return str(URL(url))
    except ValueError:
        return ""


async def _upstream_failure(
    resp: aiohttp.ClientResponse, url: str, headers: dict[str, str]
) -> UpstreamError:
    try:
        raw = await resp.content.read(1 << 20)
    except (TimeoutError, aiohttp.ClientError):
        raw = b""
    finally:
        resp.release()
    if resp.headers.get("content-encoding"):
        raw = b""  # compressed error body: we do not decode it; say so in our own message
    body: Any = None
    try:
        body = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        body = None
    passed = {k: v for k, v in headers.items() if k.lower() in ("retry-after", "x-request-id")}
    passed.update({k: v for k, v in headers.items() if k.lower().startswith("x-ratelimit-")})
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        message = str(body["error"].get("message") or f"upstream returned {resp.status}")
        return UpstreamError(message, status=resp.status, code=None, headers=passed, body=body)
    text = raw[:500].decode("utf-8", "replace").strip()
    detail = f": {text}" if text else ""
    return UpstreamError(
        f"upstream {redact(url)} returned HTTP {resp.status}{detail}",
        status=resp.status,
        code="upstream_error",
        headers=passed,
    )
