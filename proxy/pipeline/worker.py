"""The worker process that large bodies are parsed in: one process, one job at a time, bounded.

A job is a module-level function and its arguments, pickled by reference, plus one body sent
apart (`Worker.call`): `work(job, body) -> (answer, bytes back or None)`. While it runs, the
worker may ask this process questions (`ask`; `call`'s `lookup` answers them). The jobs
themselves, and the `WireRequest` a large body becomes, are in `proxy/pipeline/offload.py`.

The process is a fresh interpreter that imports only what it runs, from this process's
`sys.path` (never the working directory), spawned on the first job and stopped with the app.
Its limits: a job may hold it `JOB_SECONDS` (then it is killed and the next job starts
another), at most `MAX_WAITING` jobs wait for it, each at most `WAIT_SECONDS` (else
`OffloadBusy`, a 503 with retry-after); past `WORKER_RSS` after a job it drops the clamp caches.
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
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from ctxbudget.caps import Memo
from ctxbudget.proxy.errors import CtxBudgetError
from ctxbudget.proxy.tokens import trim_memory


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
"""Past this resident size after a job, the worker drops the clamp caches (its `memo`): they are
keyed by whole texts, and each distinct 30 MB tool result kept ~60-70 MB."""


class RemoteTraceback(Exception):
    """The worker's traceback of an error raised there (the `__cause__` of the re-raise)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


_Work = Callable[[Any, bytes], tuple[Any, bytes | None]]
"""Work the worker does: `(job, body) -> (answer, bytes to send back or None)`."""
_Lookup = Callable[[str], Any]
"""Answers the worker's questions during a job (a call id's name, for Responses)."""

# -- the worker's side ----------------------------------------------------------------------


_BOOT = (
    "import sys; sys.path[:] = sys.argv[2:]; from ctxbudget.proxy.pipeline.worker import serve; "
    "serve(int(sys.argv[1]))"
)
"""The worker's start: the parent's import path, then `serve`."""
_conn: Connection | None = None
"""The worker's end of the pipe (for `ask`)."""
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
            conn.send(("done", True, (portable(exc), traceback.format_exc()), False))
            continue
        finally:
            del data
        try:
            reply = pickle.dumps(("done", False, answer, blob is not None))
        except Exception as exc:  # what cannot go back is an error, never the worker's end
            conn.send(("done", True, (portable(exc), traceback.format_exc()), False))
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


@functools.cache
def memo() -> Memo:
    """What the clamps remember in the worker process between its jobs (`caps.Memo`): one
    per process, as the app's is one per app (an app's never crosses the pipe)."""
    return Memo()


def _clear_caps_caches() -> None:
    """Past the worker's memory bound: everything kept from earlier jobs goes (the clamps'
    memo, what was kept of resent items and lists, what was kept by identity)."""
    from ctxbudget.proxy.cache.registry import clear_kept
    from ctxbudget.proxy.cache.resent import RESENT
    from ctxbudget.proxy.pipeline.jobs import conversations

    memo().clear()
    clear_kept()  # the proxy's own module-level caches of the `caps._kept` types
    RESENT.clear()
    conversations().clear()


def ask(question: str) -> Any:
    """Ask the parent process during a job (`Worker.call`'s `lookup`)."""
    if _conn is None:
        return None
    _conn.send(("ask", question))
    return _conn.recv()


def portable(exc: BaseException) -> BaseException:
    """`exc`, or a RuntimeError saying the same when `exc` does not survive pickling."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{exc.__class__.__name__}: {exc}")
    return exc


# -- this process's side ----------------------------------------------------------------------


class Worker:
    """The worker process: spawned on first use, stopped by `close()`.

    One request at a time over one pipe. The body goes down it with `send_bytes`, which
    writes straight from the body's buffer in pieces that release the GIL: pickling it
    (as a `ProcessPoolExecutor` does) copies 30 MB in one call and stalled the loop up to
    120 ms.
    """

    def __init__(self, *, env: Mapping[str, str] | None = None) -> None:
        self._env = dict(env or {})
        """Set in the worker's environment beside this process's own."""
        self._lock = threading.Lock()
        """Held by the one job the worker runs."""
        self._queued = 0
        """Jobs `run` queued for the waiting thread (the event loop's count)."""
        self.jobs = 0
        """Jobs the worker was given since this started (each `call`): what tests count."""
        self._conn: Connection | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="ctxbudget-offload")
        """Waits on the worker, so large bodies never hold the loop's default threads."""
        self._closed = False

    @property
    def pid(self) -> int | None:
        """The worker's process id, while one runs."""
        return self._process.pid if self._process is not None else None

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
            self.jobs += 1  # under the lock: one job at a time
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
                    env={**os.environ, **self._env} if self._env else None,
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
