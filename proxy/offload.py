"""Large bodies, parsed and clamped in a process of their own.

A worker thread does not keep a 30 MB request from stalling the event loop: the work is a few
single C calls over the one 30 MB string (orjson parsing the messages ~60 ms, the web_fetch
clamp parsing the JSON inside the tool result ~60 ms, splitting it ~20 ms), and each holds the
GIL from start to end. So a body over `LARGE_BODY` goes to one worker process
(spawned on the first such body, shut down with the app), which parses it, finds the user
turn, clamps, counts the tokens saved, hashes the session prefix's blocks and encodes. The
event loop gets back what the rest of the pipeline reads — an `OffloadedRequest`: model,
stream, the user turn, the system text, the segments (without their texts) and their token
counts, the blocks as `Digested` stand-ins (`proxy/sessions.py`: digests, the bytes of small
blocks, the token counts of large ones), the short top-level fields, and the clamped bytes —
and never holds the parsed 30 MB nor hashes it.

What changes the body later is recorded and applied in the worker on a second trip: memory
blocks (`place_memory`, `inject`) when the session stage settles the request (`settle`: the
changed blocks come back digested, with the text of a new memory block), and
`stream_options.include_usage` when the body is encoded. A Responses continuation's call
names are asked of this process's `CallNames` while the worker clamps. A chat command in a
large request is answered from a small copy of the body with its large values emptied (what
the answer reads: model, stream, stream_options).

What stays in this process per large body: one copy of it into the pipe to the worker and,
when the forwarded body is large too, one copy back.
"""

from __future__ import annotations

import asyncio
import functools
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

import msgspec
import orjson

from caps import Caps, Clamp, Segment, ToolNames
from memory.inject import Placement
from memory.query import UserTurn
from proxy.command import find_command
from proxy.errors import CtxBudgetError
from proxy.report import segment_tokens_saved
from proxy.sessions import Block, Digested, PrefixChange, digested, memory_added, serial
from proxy.settings import Settings
from proxy.tokens import TokenCounter, encoding_name, trim_memory
from proxy.wire.responses import CallNames, OpenAIResponses
from proxy.wire.types import WireFormat, WireRequest

LARGE_BODY = 1 << 20
"""Bodies past this many bytes are parsed, clamped, counted, hashed and spliced in the
worker process (`Offload.threshold`); smaller ones skip the hop (~1 ms there and back)."""
MANY_OBJECTS = 4096
"""Bodies with more `{` than this take the worker too, whatever their size (`Offload.objects`).
The event loop spends ~13 µs on each message, block or item (parsing, the clamp's walk,
hashing each block for the session), so 12,700 tiny Responses items in 1 MB held it ~0.5 s
(issue 24); 4,096 objects is ~50 ms. A `{` inside a string counts too: an overestimate that
at worst costs a small body the hop. OpenClaw's requests have ~1,100 (mostly `tools`)."""
_EMPTY = {ord("["): b"[]", ord("{"): b"{}", ord('"'): b'""'}
SMALL_FIELD = 1 << 16
"""Top-level fields up to this many bytes come back to the event loop (`get`); a chat
command's copy of a large body keeps its values up to this size."""


class OffloadError(CtxBudgetError):
    """The worker process that parses large bodies exited while it held this request."""

    status = 500
    code = "offload_failed"


class OffloadBusy(OffloadError):
    """Too many large bodies wait for the worker process already: try again shortly."""

    status = 503
    code = "offload_busy"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.headers = {"retry-after": "2"}


JOB_SECONDS = 60.0
"""The longest one job may hold the worker (a 30 MB body takes ~1-2 s): past it the worker is
stopped (it is stuck) and the request gets `OffloadError`; the next starts another."""
WAIT_SECONDS = 30.0
"""The longest a large body waits for the worker behind others: then `OffloadBusy` (503)."""
MAX_WAITING = 8
"""Large bodies that may wait for the worker at once; one more gets `OffloadBusy` at once."""
WORKER_RSS = 1 << 30
"""Past this resident size after a job, the worker drops the clamp caches (`caps`): they are
keyed by whole texts, and each distinct 30 MB tool result kept ~60-70 MB."""


class RemoteTraceback(Exception):
    """The worker's traceback of an error raised there (the `__cause__` of the re-raise)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


# -- what crosses to the worker and back ---------------------------------------------------

_Work = Callable[[Any, bytes], tuple[Any, bytes | None]]
"""Work the worker does: `(job, body) -> (answer, bytes to send back or None)`."""
_Lookup = Callable[[str], Any]
"""Answers the worker's questions during a job (a call id's name, for Responses)."""
Change = tuple[str, Any, Any]
"""A recorded change: `("place", block index, text)` or `("inject", lines, placement)`."""


@dataclass(frozen=True, kw_only=True)
class _Prepare:
    wire: WireFormat | None
    """The format; None for OpenAI Responses, whose call names stay in this process."""
    owner: str
    clamp: Clamp
    caps: Caps
    tools: ToolNames
    apply: bool
    encoding: str
    """The default tiktoken encoding (`Settings.default_encoding`)."""


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """What the worker found in a large body: all the event loop keeps of it (beside the
    clamped bytes, sent back apart)."""

    model: str | None = None
    stream: bool = False
    note: str | None = None
    turn: UserTurn | None = None
    system_text: str = ""
    segments: tuple[Segment, ...] = ()
    """As the clamp returned them, without their texts (`original`, `clamped`)."""
    segment_tokens: tuple[int, ...] = ()
    failure: tuple[BaseException, str] | None = None
    """The exception the clamp raised, and its traceback there."""
    asks_usage: bool = False
    """What `ask_usage()` would answer."""
    encoding: str = ""
    """The request's tiktoken encoding (large blocks' tokens are counted in it)."""
    blocks: tuple[Block, ...] = ()
    """The cached prefix (`WireRequest.blocks()`) after the clamp, values as `Digested`."""
    fields: dict[str, Any] | None = None
    """Top-level fields of at most `SMALL_FIELD` bytes, as `get` reads them."""
    skeleton: bytes | None = None
    """For a chat command: the body with its large values emptied."""


@dataclass(frozen=True, kw_only=True)
class _Finish:
    wire: WireFormat | None
    owner: str
    changes: tuple[Change, ...]
    ask_usage: bool = False
    litellm: bool = False
    blocks: bool = False
    """Send back the blocks the changes touched, digested (`settle`)."""
    encoding: str = ""


@dataclass(frozen=True, kw_only=True)
class _Count:
    wire: WireFormat | None
    owner: str
    labels: frozenset[str]
    encoding: str


@dataclass(frozen=True, kw_only=True)
class Settled:
    """What `_finish` found when asked for blocks: each block as forwarded now (None: as it
    was before the changes), and the memory block `inject` added."""

    blocks: tuple[Digested | None, ...]
    added: dict[int, str]


# -- the worker's side -----------------------------------------------------------------------


_BOOT = (
    "import sys; sys.path[:] = sys.argv[2:]; from proxy.offload import serve; "
    "serve(int(sys.argv[1]))"
)
"""The worker's start: the parent's import path, then `serve`."""
_conn: Connection | None = None
"""The worker's end of the pipe (for `_ask`)."""
_RECURSION = 5_000
"""The worker's recursion limit: room for values nested as deep as the parsers take."""


def serve(fd: int) -> None:
    """The worker process: one job at a time from the socket `fd` until it closes."""
    global _conn
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the server, which stops us
    # The body's parsers take ~1,000 levels of nesting, and pickling an answer that holds
    # such a value (a small top-level field) recurses once per level: at the default limit
    # 500 levels killed the worker (issue 24). Jobs run on this process's main thread.
    sys.setrecursionlimit(max(sys.getrecursionlimit(), _RECURSION))
    conn = _conn = Connection(fd)
    while True:
        try:
            work, job = pickle.loads(conn.recv_bytes())
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            answer, blob = work(job, data)
        except Exception as exc:
            conn.send(("done", True, (_portable(exc), traceback.format_exc()), False))
            continue
        finally:
            del data
        try:
            reply = pickle.dumps(("done", False, answer, blob is not None))
        except Exception as exc:  # what cannot go back is an error, never the worker's end
            conn.send(("done", True, (_portable(exc), traceback.format_exc()), False))
            continue
        conn.send_bytes(reply)
        if blob is not None:
            conn.send_bytes(blob)
        del answer, blob
        if _resident() > WORKER_RSS:
            _clear_caps_caches()
        trim_memory()


def _resident() -> int:
    """This process's resident size in bytes (Linux; elsewhere 0)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _clear_caps_caches() -> None:
    from caps import bootstrap, toolresults

    bootstrap._clamp_cached.cache_clear()
    bootstrap.clamp_body.cache_clear()
    toolresults._clamp_cached.cache_clear()


def _ask(question: str) -> Any:
    """Ask the parent process during a job (`Offload.call`'s `lookup`)."""
    if _conn is None:
        return None
    _conn.send(("ask", question))
    return _conn.recv()


class _Names(CallNames):
    """Call names looked up in the parent process's `CallNames`."""

    def get(self, owner: str, call_id: str) -> tuple[str, str] | None:
        found = _ask(call_id)
        return None if found is None else (found[0], found[1])


@functools.cache
def _tokens() -> TokenCounter:
    return TokenCounter()


def _wire(wire: WireFormat | None) -> WireFormat:
    return wire if wire is not None else OpenAIResponses(_Names())


def _prepare(job: _Prepare, raw: bytes) -> tuple[Prepared, bytes | None]:
    wire = _wire(job.wire)
    request = wire.parse(raw, owner=job.owner)
    turn = request.user_turn()
    if wire.generates and find_command(turn) is not None:
        found = Prepared(model=request.model, stream=request.stream, turn=turn)
        return replace(found, skeleton=_skeleton(raw)), None
    failure = None
    segments: tuple[Segment, ...] = ()
    try:
        segments = tuple(request.clamp(job.clamp, job.caps, job.tools, apply=job.apply))
    except Exception as exc:  # the pipeline decides between fail-open and closed
        failure = (_portable(exc), traceback.format_exc())
    encoding = encoding_name(request.model, job.encoding)
    encoded = request.encode() if request.changed else None
    found = Prepared(
        model=request.model,
        stream=request.stream,
        note=request.note,
        turn=turn,
        system_text=request.system_text(),
        segments=tuple(replace(s, original="", clamped="") for s in segments),
        segment_tokens=tuple(segment_tokens_saved(_tokens(), s, encoding) for s in segments),
        failure=failure,
        encoding=encoding,
        # token counting has no session: no blocks to hash
        blocks=_digested_blocks(request.blocks(), encoding) if wire.generates else (),
        fields=_small_fields(request, raw),
        asks_usage=request.ask_usage(),  # asked after encoding: only the answer is kept
    )
    return found, encoded


def _digested_blocks(blocks: Sequence[Block], encoding: str) -> tuple[Block, ...]:
    """`blocks` with `Digested` values; the first after `tools` keeps its stable text. A
    large block as forwarded is counted here (the clamp made it: rare), one as the client sent
    it only if the session stage finds it moved, while the request goes on
    (`OffloadedRequest.defer_count`)."""

    def count(text: str) -> int:
        return _tokens().count(text, encoding)

    out = []
    stable = True
    for b in blocks:
        first = stable and b.label != "tools"
        stable = stable and not first
        client = digested(b.client, stable=first)
        forwarded = client if b.forwarded is b.client else digested(b.forwarded, count)
        out.append(Block(b.label, client, forwarded))
    return tuple(out)


def _count(job: _Count, raw: bytes) -> tuple[dict[str, int], None]:
    """The tokens of the client's blocks `job.labels` of `raw`."""
    request = _wire(job.wire).parse(raw, owner=job.owner)
    return {
        b.label: _tokens().count(serial(b.client).decode(errors="replace"), job.encoding)
        for b in request.blocks()
        if b.label in job.labels
    }, None


def _finish(job: _Finish, body: bytes) -> tuple[Any, bytes | None]:
    request = _wire(job.wire).parse(body, owner=job.owner)
    start = request.blocks() if job.blocks else []
    before = start
    for kind, first, second in job.changes:
        if kind == "place":
            request.place_memory(first, second)
        else:
            if job.blocks and before is start:
                before = request.blocks()
            request.inject(first, second)
    if job.ask_usage:
        request.ask_usage()
    if job.litellm:
        return request.litellm_body(), None
    encoded = request.encode()
    if not job.blocks:
        return None, encoded

    def count(text: str) -> int:
        return _tokens().count(text, job.encoding)

    after = request.blocks()
    added = memory_added(before, after) if before is not start else {}
    if len(after) != len(start):
        after = start  # no change adds blocks; be safe if one does
    blocks = tuple(
        None if new.forwarded is old.forwarded else digested(new.forwarded, count)
        for old, new in zip(start, after, strict=True)
    )
    return Settled(blocks=blocks, added=added), encoded


def _small_fields(request: WireRequest, raw: bytes) -> dict[str, Any]:
    """The top-level fields of at most `SMALL_FIELD` bytes, as `request.get` reads them."""
    try:
        fields = msgspec.json.decode(raw, type=dict[str, msgspec.Raw])
    except msgspec.MsgspecError:
        return {}
    return {key: request.get(key) for key, value in fields.items() if len(value) <= SMALL_FIELD}


def _skeleton(raw: bytes) -> bytes | None:
    """`raw` with each top-level value over `SMALL_FIELD` bytes emptied, or None when it
    is not a plain JSON object."""
    try:
        fields = msgspec.json.decode(raw, type=dict[str, msgspec.Raw])
    except msgspec.MsgspecError:
        return None
    parts = []
    for key, value in fields.items():
        data = bytes(value) if len(value) <= SMALL_FIELD else _EMPTY.get(memoryview(value)[0])
        if data is None:
            return None
        parts.append(orjson.dumps(key) + b":" + data)
    return b"{" + b",".join(parts) + b"}"


def _portable(exc: BaseException) -> BaseException:
    """`exc`, or a RuntimeError saying the same when `exc` does not survive pickling."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{exc.__class__.__name__}: {exc}")
    return exc


# -- the event loop's side -------------------------------------------------------------------


class Offload:
    """The worker process for large bodies: spawned on first use, stopped by `close()`.

    One request at a time over one pipe. The body goes down it with `send_bytes`, which
    writes straight from the body's buffer in pieces that release the GIL: pickling it
    (as a `ProcessPoolExecutor` does) copies 30 MB in one call and stalled the loop up to
    120 ms.
    """

    def __init__(self, *, threshold: int = LARGE_BODY, objects: int = MANY_OBJECTS) -> None:
        self.threshold = threshold
        """Bodies of more bytes than this go to the worker (`takes`)."""
        self.objects = objects
        """Bodies with more `{` than this go too (`takes`)."""
        self._lock = threading.Lock()
        """Held by the one job the worker runs."""
        self._queued = 0
        """Jobs `run` queued for the waiting thread (the event loop's count)."""
        self._conn: Connection | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="ctxbudget-offload")
        """Waits on the worker, so large bodies never hold the loop's default threads."""
        self._closed = False

    def takes(self, raw: bytes) -> bool:
        """Whether `raw` is parsed in the worker: over `threshold` bytes, or over `objects`
        JSON objects by a count of `{` (one C scan, ~0.1 ms a MB, before anything is parsed)."""
        return len(raw) > self.threshold or raw.count(b"{") > self.objects

    @property
    def pid(self) -> int | None:
        """The worker's process id, while one runs."""
        return self._process.pid if self._process is not None else None

    async def prepare(
        self,
        wire: WireFormat,
        raw: bytes,
        *,
        owner: str,
        clamp: Clamp,
        settings: Settings,
        apply: bool,
    ) -> tuple[WireRequest, UserTurn | None]:
        """`raw` parsed and clamped in the worker: an `OffloadedRequest`, or for a chat
        command a request parsed from the body's skeleton. `BadRequest` as `wire.parse`."""
        responses = isinstance(wire, OpenAIResponses)
        job = _Prepare(
            wire=None if responses else wire,
            owner=owner,
            clamp=clamp,
            caps=settings.caps,
            tools=settings.tool_names,
            apply=apply,
            encoding=settings.default_encoding,
        )
        lookup = None
        if isinstance(wire, OpenAIResponses):
            names = wire.names
            lookup = functools.partial(names.get, owner)
        found, encoded = await self.run(_prepare, job, raw, lookup)
        if found.skeleton is not None:
            return wire.parse(found.skeleton, owner=owner), found.turn
        return OffloadedRequest(raw, found, encoded, self, job.wire, owner), found.turn

    async def run(
        self, work: _Work, job: Any, data: bytes, lookup: _Lookup | None = None
    ) -> tuple[Any, bytes | None]:
        """`call` from the worker's own waiting thread, behind the jobs queued there: at
        most `MAX_WAITING` of them, each for at most `WAIT_SECONDS`, else `OffloadBusy`. A
        job whose request is cancelled (its client left) before it starts never runs."""
        if self._queued >= MAX_WAITING:
            raise OffloadBusy(self._busy(f"{self._queued} large request bodies wait"))
        self._queued += 1
        gone, started = threading.Event(), threading.Event()
        run = functools.partial(
            self.call,
            work,
            job,
            data,
            lookup,
            until=time.monotonic() + WAIT_SECONDS,
            gone=gone,
            started=started,
        )
        try:
            answer = asyncio.get_running_loop().run_in_executor(self._thread, run)
            await asyncio.wait([answer], timeout=WAIT_SECONDS)
            if not answer.done() and not started.is_set():
                gone.set()  # behind a job that holds the worker long: never run this one
                answer.cancel()
                raise OffloadBusy(self._busy(f"this one waited {WAIT_SECONDS:.0f} s"))
            return await answer
        except asyncio.CancelledError:
            gone.set()
            answer.cancel()  # still queued: dropped from the waiting thread's queue
            raise
        finally:
            self._queued -= 1

    def call(
        self,
        work: _Work,
        job: Any,
        data: bytes,
        lookup: _Lookup | None = None,
        *,
        until: float | None = None,
        gone: threading.Event | None = None,
        started: threading.Event | None = None,
    ) -> tuple[Any, bytes | None]:
        """`work(job, data)` in the worker: its answer and the bytes it sent back; `lookup`
        answers what the worker asks meanwhile. Waits for the worker until `until`
        (monotonic; default `WAIT_SECONDS` from now), and skips the job when `gone` is set
        by then. Blocks: call it from a thread, never the event loop."""
        try:
            payload = pickle.dumps((work, job))
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise OffloadError(
                f"a large request body could not go to the worker process ({exc}): the worker "
                "imports what it runs by name, so a clamp given to create_app must be a "
                "module-level function"
            ) from exc
        if until is None:
            until = time.monotonic() + WAIT_SECONDS
        if not self._lock.acquire(timeout=max(0.0, until - time.monotonic())):
            raise OffloadBusy(self._busy(f"this one waited {WAIT_SECONDS:.0f} s"))
        try:
            if gone is not None and gone.is_set():
                raise OffloadError("the client left before its body was parsed")
            if started is not None:
                started.set()
            conn = self._connection()
            deadline = time.monotonic() + JOB_SECONDS

            def receive() -> Any:
                if not conn.poll(max(0.0, deadline - time.monotonic())):
                    raise TimeoutError(f"no answer within {JOB_SECONDS:.0f} s")
                return conn.recv()

            try:
                conn.send_bytes(payload)
                conn.send_bytes(data)
                message = receive()
                while message[0] == "ask":
                    conn.send(lookup(message[1]) if lookup is not None else None)
                    message = receive()
                _, failed, answer, more = message
                if more and not conn.poll(max(0.0, deadline - time.monotonic())):
                    raise TimeoutError(f"no body back within {JOB_SECONDS:.0f} s")
                blob = conn.recv_bytes() if more else None
            except (EOFError, OSError) as exc:  # TimeoutError is an OSError
                self._stop(kill=isinstance(exc, TimeoutError))
                raise OffloadError(
                    f"the worker process for large request bodies stopped ({exc}); the next "
                    "large request starts another"
                ) from exc
        finally:
            self._lock.release()
        if failed:
            error, text = answer
            raise error from RemoteTraceback(text)
        return answer, blob

    def later(self, work: _Work, job: Any, data: bytes) -> Future[Any]:
        """`work(job, data)`'s answer, from the worker's own waiting thread after what is
        queued there."""
        late: Future[Any] = Future()

        def run() -> None:
            try:
                answer, _ = self.call(work, job, data)
            except BaseException as exc:
                late.set_exception(exc)
            else:
                late.set_result(answer)

        def dropped(job: Future[None]) -> None:
            if job.cancelled():  # never ran: the app stopped first
                late.set_exception(OffloadError("stopped before the count ran"))

        try:
            self._thread.submit(run).add_done_callback(dropped)
        except RuntimeError as exc:  # shut down with the app
            late.set_exception(exc)
        return late

    @staticmethod
    def _busy(why: str) -> str:
        return (
            f"ctxbudget is busy with large request bodies ({why}): retry in a few seconds, or "
            "send smaller bodies (each over 1 MiB is parsed in one worker process, in turn)"
        )

    def _connection(self) -> Connection:
        if self._closed:
            raise OffloadError("the worker process for large request bodies was stopped")
        if self._conn is None or self._process is None or self._process.poll() is not None:
            self._stop()
            # A fresh interpreter that imports only this module: not fork (this process has
            # threads), and not multiprocessing's spawn, which re-runs the parent's __main__.
            ours, theirs = socket.socketpair()
            with theirs:
                # It imports what this process would (its sys.path), never from the working
                # directory as `python -c` does by default: a stray `orjson.py` in a project
                # folder would run with every key in the environment.
                path = [p for p in sys.path if p]
                self._process = subprocess.Popen(
                    [sys.executable, "-P", "-c", _BOOT, str(theirs.fileno()), *path],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL,
                    cwd="/",
                )
            self._conn = Connection(ours.detach())
        return self._conn

    def _stop(self, *, kill: bool = False) -> None:
        conn, process = self._conn, self._process
        self._conn = self._process = None
        if process is not None and kill:
            process.kill()  # stuck: it would not read the EOF
        if conn is not None:
            conn.close()  # the worker reads EOF and exits
        if process is not None:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    async def close(self) -> None:
        """Stop the worker and the waiting thread. A job still running (the server waited
        for its requests already) fails with `OffloadError`: shutting down never waits for
        a stuck worker."""

        def stop() -> None:
            self._closed = True
            process = self._process
            if process is not None and process.poll() is None:
                process.kill()  # a job holding the lock reads EOF and lets go
            if self._lock.acquire(timeout=5):
                try:
                    self._stop()
                finally:
                    self._lock.release()

        await asyncio.to_thread(stop)
        self._thread.shutdown(wait=False, cancel_futures=True)


class OffloadedRequest:
    """A `WireRequest` parsed and clamped in the worker process (`Offload.prepare`).

    `clamp()` returns what the worker's clamp found (it ran with this request's caps and
    budget); `blocks()` are `Digested`. `place_memory()`, `inject()` and `ask_usage()` are
    recorded and applied in the worker: by `settle()` (the pipeline's session stage awaits
    it, so `blocks()` show the memory blocks) and by `encode()`, which therefore may wait on
    the worker: call it from a thread, never the event loop.
    """

    def __init__(
        self,
        raw: bytes,
        found: Prepared,
        clamped: bytes | None,
        offload: Offload,
        wire: WireFormat | None,
        owner: str,
    ) -> None:
        self.raw = raw
        self.model = found.model
        self.stream = found.stream
        self.note = found.note
        self.found = found
        self.segment_tokens = found.segment_tokens
        """Tokens saved per segment, counted in the worker beside the clamp."""
        self.memory_added: dict[int, str] = {}
        """The memory block `inject` added, by block index (known once settled)."""
        self._base = raw if clamped is None else clamped
        """What goes upstream when nothing is pending: as sent, clamped, or settled."""
        self._blocks = list(found.blocks)
        self._pending: list[Change] = []
        self._offload = offload
        self._wire = wire
        self._owner = owner
        self._ask = False
        self._encoded: bytes | None = None
        self._late: tuple[frozenset[str], Future[dict[str, int]]] | None = None

    @property
    def changed(self) -> bool:
        return self._base is not self.raw or bool(self._pending) or self._ask

    def user_turn(self) -> UserTurn | None:
        return self.found.turn

    def system_text(self) -> str:
        return self.found.system_text

    def clamp(self, clamp: Clamp, caps: Caps, tools: ToolNames, *, apply: bool) -> list[Segment]:
        if self.found.failure is not None:
            exc, text = self.found.failure
            raise exc from RemoteTraceback(text)
        return list(self.found.segments)

    def get(self, key: str) -> Any:
        """A top-level field as a Python value; None for one over `SMALL_FIELD` bytes
        (what reads fields here reads short ones: session ids, `metadata`)."""
        return (self.found.fields or {}).get(key)

    def blocks(self) -> list[Block]:
        """The blocks as `Digested`; a change not yet settled does not show in them."""
        return list(self._blocks)

    def inject(self, lines: Sequence[str], placement: Placement) -> None:
        self._change(("inject", tuple(lines), placement))

    def place_memory(self, index: int, text: str) -> None:
        self._change(("place", index, text))

    def _change(self, change: Change) -> None:
        self._pending.append(change)
        self._encoded = None

    async def settle(self) -> None:
        """Apply the recorded memory blocks in the worker: `blocks()` and `memory_added`
        then show them."""
        if not self._pending:
            return
        job = self._finish(blocks=True)
        settled, encoded = await self._offload.run(_finish, job, self._base)
        if encoded is None:
            raise OffloadError("the worker process sent no body back")
        self._blocks = [
            b if new is None else Block(b.label, b.client, new)
            for b, new in zip(self._blocks, settled.blocks, strict=True)
        ]
        self.memory_added = settled.added
        self._base = encoded
        self._pending = []
        self._encoded = None

    def defer_count(self, change: PrefixChange) -> PrefixChange:
        """`change`, with its moved blocks that were not counted (large, as the client sent
        them) to be counted in the worker once the body has gone upstream (`encode`): the
        report's writer waits for them (`PrefixChange.late`), the request does not."""
        labels = frozenset(
            m.label
            for m in change.moved
            for d in (m.client, m.forwarded)
            if isinstance(d, Digested) and not d.counted
        )
        if not labels:
            return change
        self._late = (labels, Future())
        return replace(change, late=self._late[1])

    def _count_late(self) -> None:
        """Start the count `defer_count` set aside (once)."""
        late, self._late = self._late, None
        if late is None:
            return
        labels, future = late
        job = _Count(
            wire=self._wire, owner=self._owner, labels=labels, encoding=self.found.encoding
        )
        self._offload.later(_count, job, self.raw).add_done_callback(
            lambda done: _copy(done, future)
        )

    def ask_usage(self) -> bool:
        if self.found.asks_usage:
            self._ask = True
            self._encoded = None
        return self.found.asks_usage

    def forget_usage(self) -> None:
        self._ask = False
        self._encoded = None

    def encode(self) -> bytes:
        try:
            if not self._pending and not self._ask:
                return self._base
            if self._encoded is None:
                job = self._finish(ask_usage=self._ask)
                _, blob = self._offload.call(_finish, job, self._base)
                if blob is None:
                    raise OffloadError("the worker process sent no body back")
                self._encoded = blob
            return self._encoded
        finally:
            self._count_late()  # after the body it waits behind

    def litellm_body(self) -> dict[str, Any] | None:
        try:
            answer, _ = self._offload.call(_finish, self._finish(litellm=True), self._base)
        finally:
            self._count_late()
        found: dict[str, Any] | None = answer
        return found

    def _finish(self, **how: bool) -> _Finish:
        return _Finish(
            wire=self._wire,
            owner=self._owner,
            changes=tuple(self._pending),
            encoding=self.found.encoding,
            **how,
        )


def _copy(done: Future[Any], to: Future[Any]) -> None:
    exc = done.exception()
    if exc is not None:
        to.set_exception(exc)
    else:
        to.set_result(done.result())
