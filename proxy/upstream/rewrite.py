"""Deep recall's LLM rewrite: a configured model turns the query into more search words.

Only the `deep` profile asks, only when `memory.rewrite` is configured, and at most once per
query: the answer is kept (bounded LRU), so every request of one tool loop gets the same words,
the same memories and the same prompt-cache prefix. A failure or timeout costs one request its
rewrite, never the request; after one, the model is left alone for a minute.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from cachetools import LRUCache

from proxy.config.schema import RewriteConfig
from proxy.upstream.litellm import import_litellm

log = logging.getLogger("ctxbudget.memory")

PROMPT = (
    "You rewrite search queries for a keyword index of a person's saved notes. Reply with at"
    " most 12 search words for the query: synonyms, related terms, the full forms of"
    " abbreviations and the parts of compound names. One line of words separated by spaces,"
    " nothing else."
)
MAX_WORDS = 12
_CACHED = 512
_COOLDOWN = 60.0
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


Complete = Callable[..., Awaitable[Any]]
"""`litellm.acompletion`'s shape: keyword arguments in, an OpenAI-shaped response out."""


class Rewriter:
    """Asks the configured model for search words, with a cache and a cooldown on failure."""

    def __init__(
        self,
        complete: Complete | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._complete = complete
        """None: litellm's `acompletion`."""
        self._clock = clock
        self._cache: LRUCache[tuple[str, str, str], list[str]] = LRUCache(maxsize=_CACHED)
        self._failed_at: float | None = None

    async def words(
        self, query: str, cfg: RewriteConfig, env: Mapping[str, str], *, owner: str = ""
    ) -> tuple[list[str], str]:
        """Search words for `query`, and a line saying where they came from. Kept per
        `owner`: another owner asking the same is asked of the model again, so neither the
        time nor the note ("cached") says that someone asked it before."""
        key = (owner, cfg.model, query)
        cached = self._cache.get(key)
        if cached is not None:
            return cached, f"LLM rewrite by {cfg.model} (cached)"
        if self._failed_at is not None and self._clock() - self._failed_at < _COOLDOWN:
            return [], f"LLM rewrite skipped: {cfg.model} failed less than a minute ago"
        complete = self._complete
        if complete is None:
            try:
                # The server starts importing litellm at start-up (~5 s); a request that comes
                # sooner waits at most the rewrite timeout for it, and goes on without it.
                litellm = await asyncio.wait_for(
                    asyncio.to_thread(import_litellm), cfg.timeout_seconds
                )
            except TimeoutError:
                return [], "LLM rewrite skipped: litellm is still loading"
            complete = litellm.acompletion
        try:
            response = await asyncio.wait_for(
                complete(
                    model=cfg.model,
                    messages=[
                        {"role": "system", "content": PROMPT},
                        {"role": "user", "content": query},
                    ],
                    api_base=cfg.api_base,
                    api_key=env.get(cfg.api_key_env) if cfg.api_key_env else None,
                    max_tokens=64,
                    temperature=0,
                    drop_params=True,
                ),
                cfg.timeout_seconds,
            )
            text = response.choices[0].message.content or ""
        except Exception as exc:  # noqa: BLE001 - any failure: recall goes on without it
            self._failed_at = self._clock()
            reason = "timed out" if isinstance(exc, TimeoutError) else type(exc).__name__
            log.warning("LLM rewrite by %s failed: %s", cfg.model, reason)
            return [], f"LLM rewrite by {cfg.model} failed ({reason}); offline expansion only"
        self._failed_at = None
        words = list(dict.fromkeys(w.lower() for w in _WORD.findall(text)))[:MAX_WORDS]
        self._cache[key] = words
        return words, f"LLM rewrite by {cfg.model}: {len(words)} words"
