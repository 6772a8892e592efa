"""Summaries of long tool results, to stand for them once pruned (`contextPruning.summarize`,
opt-in: ADR 0001 phase 2).

A result of at least `summarize.minChars` is summarised once it can be pruned, off the request
path: a task asks `summarize.model` — through litellm when `proxy.routes` names it, else the
proxy's own upstream (`proxy.upstream.baseUrl`, chat completions, the upstream key) — and keeps
the answer beside pruning's decisions (`proxy/report/ledger.py`), where every worker finds it.
When the result is pruned later, the summary with where it came from (tool, call id, what it
ran or read, the original size) stands for it instead of the placeholder (`summary_text`). A
summary is a request ctxbudget makes: it is recorded in the report as such (`overhead`: all
cost, nothing saved), so the session's net money counts it. A failure or a timeout costs only
the summary: the placeholder stands in, and the model is left alone for a minute.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import time
from collections.abc import Mapping
from typing import Any

import orjson

from caps import Segment
from caps._text import utf16_head, utf16_len
from proxy.config.settings import Settings
from proxy.report import ReportStore, RequestRecord
from proxy.report.prices import prices
from proxy.report.usage import UsageReader
from proxy.upstream.http import UpstreamClient

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
MAX_RUNNING = 4
"""Summaries asked at once; more wait for a later request to ask again."""


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


class Summarizer:
    """Asks for summaries in the background, at most `MAX_RUNNING` at once."""

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
        self._running: dict[tuple[str, str, str], asyncio.Task[None]] = {}
        self._failed_at: float | None = None

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
        long enough and has no summary (`have`) nor one being asked."""
        pruning = settings.pruning
        if pruning is None or pruning.summarize_model is None:
            return
        if self._failed_at is not None and time.monotonic() - self._failed_at < COOLDOWN_SECONDS:
            return
        for s in segments:
            key = (owner, conversation, s.call_id or "")
            if (
                s.call_id is None
                or s.call_id in have
                or key in self._running
                or s.before < pruning.summarize_min_chars
                or not s.original  # a large body's texts stay in the offload process
                or len(self._running) >= MAX_RUNNING
            ):
                continue
            task = asyncio.get_running_loop().create_task(
                self._summarise(s, owner, conversation, session, settings)
            )
            self._running[key] = task
            task.add_done_callback(functools.partial(self._done, key))

    def _done(self, key: tuple[str, str, str], task: asyncio.Task[None]) -> None:
        self._running.pop(key, None)

    async def close(self) -> None:
        """Cancel what is still being asked (the app stops)."""
        for task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)

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
        try:
            status, data = await asyncio.wait_for(self._send(body, settings), TIMEOUT_SECONDS)
            usage = UsageReader("chat").read_json(data)
            found = orjson.loads(data) if status == 200 else None
            answer = found["choices"][0]["message"]["content"] if found else None
        except Exception as exc:  # noqa: BLE001 - a summary is never worth a failure
            self._failed_at = time.monotonic()
            reason = "timed out" if isinstance(exc, TimeoutError) else type(exc).__name__
            log.warning("summary by %s failed (%s): the placeholder stands in", model, reason)
        self._record(model, s, owner, session, status, started, usage)
        if not isinstance(answer, str) or not answer.strip():
            if status and status != 200:
                self._failed_at = time.monotonic()
                log.warning("summary by %s answered %d: the placeholder stands in", model, status)
            return
        await asyncio.to_thread(
            self._reports.ledger.add_summary,
            owner,
            conversation,
            s.call_id or "",
            answer.strip(),
            at=self._clock(),
        )

    async def _send(self, body: dict[str, Any], settings: Settings) -> tuple[int, bytes]:
        model = body["model"]
        route = settings.route_for(model)
        if route is not None:
            from proxy.upstream.litellm import litellm_reply

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
                overhead=True,
            )
        )
