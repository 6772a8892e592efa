"""Summaries of long tool results, to stand for them once pruned (`contextPruning.summarize`,
opt-in: ADR 0001 phase 2).

A result of at least `summarize.minChars` is summarised once it can be pruned, off the request
path and only after the request that carried it was answered (an agent retrying a request the
provider refuses must not pay for summaries nobody will read): a task asks `summarize.model` —
through litellm when `proxy.routes` names it, else the proxy's own upstream
(`proxy.upstream.baseUrl`, chat completions, the upstream key) — and keeps the answer beside
pruning's decisions (`proxy/report/ledger.py`), where every worker finds it. When the result is
pruned later, the summary with where it came from (tool, call id, what it ran or read, the
original size) stands for it instead of the placeholder (`summary_text`).

A summary is a request ctxbudget makes: it is recorded in the report as such (`overhead`: all
cost, nothing saved) for the owner whose result it summarised, so that owner's net money counts
it and the report sums what their summaries cost (`totals.summaries`).

Each result is asked for at most once by a worker, whatever the answer: a failure, a timeout,
an empty answer or one the database would refuse is not asked again (`_Owner.tried`). A
failure or a timeout costs only the summary: the placeholder stands in, and the owner's
summaries are left alone for a minute (`COOLDOWN_SECONDS`). Each owner has its own slots
(`MAX_RUNNING`), so one key's slow or failing summaries never hold up another's.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from cachetools import LRUCache

from ctxbudget.caps import Segment
from ctxbudget.caps._text import utf16_head, utf16_len
from ctxbudget.proxy.config.settings import Settings
from ctxbudget.proxy.errors import UpstreamError
from ctxbudget.proxy.report import ReportStore, RequestRecord
from ctxbudget.proxy.report.prices import input_price, prices
from ctxbudget.proxy.report.record import storable
from ctxbudget.proxy.report.usage import UsageReader
from ctxbudget.proxy.upstream.http import UpstreamClient

log = logging.getLogger("ctxbudget.prune")

PROMPT = (
    "You summarise the output of a tool an AI coding agent ran earlier in its session, so the"
    " agent can recall what it showed after the full output is dropped from its context. Keep"
    " what the agent may need again: file names and paths, function and class names, error"
    " messages, numbers, versions, decisions, and what succeeded or failed. Plain text, at most"
    " 150 words, no preamble."
)
INPUT_CHARS = 60_000
"""The most of a result the summariser reads (its head): past it, a summary of the start."""
TIMEOUT_SECONDS = 60.0
COOLDOWN_SECONDS = 60.0
"""After one of an owner's summaries fails, that owner's are left alone this long (the
app's clock)."""
MAX_RUNNING = 4
"""Summaries asked at once per owner; more wait for a later answer to ask again."""
TRIED_PER_OWNER = 10_000
"""Results a worker remembers having asked a summary of, per owner (the newest; ~200 bytes
each, ~2 MB an owner at most). One pushed out may be asked once more, while it is still
prunable and has no summary kept."""
MAX_OWNERS = 1_024
"""Owners whose summaries a worker remembers (the most recently asked): each proxy key is
one, `default` the only one without keys."""


def summary_text(summary: str, segment: Segment, source: str | None = None) -> str | None:
    """What stands for a pruned result that has a summary: where it came from, then the
    summary; None when that is not shorter than what it stands for."""
    where = f", {source}" if source else ""
    head = (
        f"[Summary of an earlier tool result ({segment.tool or 'tool'} {segment.call_id}{where},"
        f" {segment.before:,} chars); run the tool again for the full output]"
    )
    text = f"{head}\n{summary.strip()}"
    return text if utf16_len(text) < segment.before else None


_Tried = LRUCache[bytes, bool]


def _tried_key(conversation: str, call_id: str) -> bytes:
    """What `_Owner.tried` keeps of a result: 16 bytes, whatever the size of the client's
    conversation and call ids (10,000 of them an owner, of any size, had no byte bound)."""
    return hashlib.blake2b(
        f"{len(conversation)}:{conversation}{call_id}".encode(errors="surrogatepass"),
        digest_size=16,
    ).digest()


@dataclass
class _Owner:
    """One owner's summaries in this worker."""

    running: dict[tuple[str, str], asyncio.Task[None]] = field(default_factory=dict)
    """(conversation, call id) → the task asking for its summary."""
    tried: _Tried = field(default_factory=lambda: LRUCache(TRIED_PER_OWNER))
    """The results asked for (`_tried_key`), whatever came of it: never asked again."""
    failed_at: float | None = None
    """When the owner's last summary failed (`COOLDOWN_SECONDS`)."""


class Summarizer:
    """Asks for summaries in the background, at most `MAX_RUNNING` at once per owner."""

    def __init__(
        self,
        reports: ReportStore,
        upstream: UpstreamClient,
        env: Mapping[str, str],
        *,
        clock: Any = time.time,
    ) -> None:
        self._reports = reports
        self._upstream = upstream
        self._env = env
        self._clock = clock
        self._owners: LRUCache[str, _Owner] = LRUCache(MAX_OWNERS)
        self._tasks: set[asyncio.Task[None]] = set()
        """Every task running, whoever's (`close` cancels them)."""

    def ask(
        self,
        segments: list[Segment],
        *,
        owner: str,
        conversation: str,
        session: str,
        have: Mapping[str, str],
        settings: Settings,
    ) -> None:
        """Summarise each of `segments` (prunable results, their texts in `original`) that is
        long enough, has no summary (`have`) and was not asked for before. Called once the
        request that carried them was answered (`proxy/pipeline/relay.py` `Recorder`)."""
        pruning = settings.pruning
        if pruning is None or pruning.summarize_model is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # an answer finished outside the app's loop: nothing to run on
            return
        state = self._owners.get(owner)
        if state is None:
            state = self._owners[owner] = _Owner()
        if state.failed_at is not None and self._clock() - state.failed_at < COOLDOWN_SECONDS:
            return
        for s in segments:
            if (
                s.call_id is None
                or s.call_id in have
                or s.before < pruning.summarize_min_chars
                or not s.original  # a large body's texts stay in the offload process
            ):
                continue
            key = (conversation, s.call_id)
            tried = _tried_key(conversation, s.call_id)
            if tried in state.tried:
                continue
            if len(state.running) >= MAX_RUNNING:
                break
            state.tried[tried] = True
            task = loop.create_task(self._summarise(s, owner, conversation, session, settings))
            state.running[key] = task
            self._tasks.add(task)
            task.add_done_callback(functools.partial(self._done, state, key))

    def _done(self, state: _Owner, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        state.running.pop(key, None)
        self._tasks.discard(task)

    async def idle(self) -> None:
        """Return once no summary is being asked (what was answered is queued for the
        report's writer by then)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        """Cancel what is still being asked (the app stops)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _summarise(
        self, s: Segment, owner: str, conversation: str, session: str, settings: Settings
    ) -> None:
        assert settings.pruning is not None and settings.pruning.summarize_model is not None
        model = settings.pruning.summarize_model
        body = {
            "model": model,
            "messages": [
                {"role": "system", "content": PROMPT},
                {"role": "user", "content": utf16_head(s.original, INPUT_CHARS)},
            ],
            "max_tokens": 400,
            "temperature": 0,
            "stream": False,
        }
        started = time.perf_counter()
        status, answer, usage = 0, None, None
        failed: str | None = None
        try:
            status, data = await asyncio.wait_for(self._send(body, settings), TIMEOUT_SECONDS)
            found, clean = _parse(data)
            # what was paid for is counted even when the answer is no use
            usage = UsageReader("chat").read_json(clean)
            answer = found["choices"][0]["message"]["content"] if status == 200 else None
            if status != 200:
                failed = f"answered {status}"
        except Exception as exc:  # noqa: BLE001 - a summary is never worth a failure
            failed = "timed out" if isinstance(exc, TimeoutError) else type(exc).__name__
            if isinstance(exc, UpstreamError):
                status = exc.status  # the report says what the upstream answered
        self._record(model, s, owner, session, status, started, usage)
        if failed is not None:
            self._owners.get(owner, _Owner()).failed_at = self._clock()
            log.warning(
                "summary by %s failed (%s): the placeholder stands in, and %s's summaries wait "
                "%.0f s",
                model,
                failed,
                owner,
                COOLDOWN_SECONDS,
            )
            return
        if not isinstance(answer, str) or not answer.strip():
            log.info("summary by %s was empty: the placeholder stands in", model)
            return
        try:
            await asyncio.to_thread(
                self._reports.ledger.add_summary,
                owner,
                conversation,
                s.call_id or "",
                storable(answer.strip()),
                at=self._clock(),
            )
        except Exception:  # noqa: BLE001 - the database's trouble: the placeholder stands in
            log.warning(
                "summary of %s could not be kept: the placeholder stands in",
                s.call_id,
                exc_info=True,
            )

    async def _send(self, body: dict[str, Any], settings: Settings) -> tuple[int, bytes]:
        model = body["model"]
        route = settings.route_for(model)
        if route is not None:
            from ctxbudget.proxy.upstream.litellm import litellm_reply

            reply: Any = await litellm_reply(body, route, stream=False, env=self._env)
        else:
            headers = {"content-type": "application/json"}
            if settings.upstream_api_key:
                headers["authorization"] = f"Bearer {settings.upstream_api_key}"
            reply = await self._upstream.request(
                "POST",
                settings.upstream_url("/chat/completions"),
                body=orjson.dumps(body),
                headers=headers,
                connect_timeout=settings.connect_timeout,
                read_timeout=settings.read_timeout,
            )
        return reply.status, await reply.read()

    def _record(
        self,
        model: str,
        s: Segment,
        owner: str,
        session: str,
        status: int,
        started: float,
        usage: Any,
    ) -> None:
        self._reports.add(
            RequestRecord(
                id=f"cb-summary-{secrets.token_hex(6)}",
                ts=self._clock(),
                model=model,
                enabled=True,
                stream=False,
                status=status or 502,
                duration_ms=(time.perf_counter() - started) * 1000,
                segments=(),
                encoding="o200k_base",
                route="summarize",
                wire="chat",
                owner=owner,
                session=session,
                note=(
                    f"a summary of {s.tool or 'tool'} {s.call_id} for pruning "
                    "(contextPruning.summarize): a cost ctxbudget adds"
                ),
                usage=usage,
                prices=prices(model),
                input_price=input_price(model),
                overhead=True,
            )
        )


def _parse(data: bytes) -> tuple[Any, bytes]:
    """The summariser's JSON answer, and its bytes as the report can read them. orjson
    refuses a lone surrogate (`\\ud800`), which a model may answer: such an answer is read
    with the standard library and its strings made storable (U+FFFD), as any client text the
    report keeps."""
    try:
        return orjson.loads(data), data
    except orjson.JSONDecodeError:
        found = storable(json.loads(data))
        return found, orjson.dumps(found)
