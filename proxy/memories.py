"""`/v1/memories`: people add, list, search and remove memories over HTTP.

Who may act for whom:
- the admin key is configured (`proxy.adminKeyEnv`): it is required, and `owner` chooses the
  owner (default `default`);
- else proxy keys are configured: a client acts for its own key's owner only;
- else (a personal setup) there is one owner, `default`.

Chat requests never write memories; only these routes and `ctxbudget memory` do.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from memory import DEFAULT_OWNER, InvalidMemory, NewMemory, SQLiteMemoryStore
from memory.budget import DEFAULT_PROFILES, AgentProfile, Complexity, bump, decide, detect
from memory.inject import inject, line
from memory.monitor import Usage, analyze, scope_of
from memory.profiles import choose
from memory.query import clean, latest_user
from memory.recall import recall
from proxy.errors import BadRequest, Forbidden, NotFound, Unauthorized
from proxy.models import context_window
from proxy.rewrite import Rewriter
from proxy.tokens import TokenCounter

if TYPE_CHECKING:
    from proxy.app import Proxy
    from proxy.config import Config
    from proxy.settings import Settings

_FIELDS = {"text", "category", "source", "scope", "owner"}


def analysis(
    store: SQLiteMemoryStore, config: Config, *, days: float, owner: str | None = None
) -> dict[str, Any]:
    """The budget monitor's recommendations over the last `days` (`ctxbudget analyze`)."""
    records = store.monitor.records(since=time.time() - days * 86_400, owner=owner)
    profiles = config.memory.budgets.profiles
    weights = {name: dict(p.scope_weights) for name, p in profiles.items()}
    return {"days": days, "requests": len(records), "recommendations": analyze(records, weights)}


class MemoryRoutes:
    """The memory endpoints of one app; the store opens on first use."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self._store: SQLiteMemoryStore | None = None
        # one token cache with the proxy's own counting (event loop only)
        self._tokens = proxy.tokens if proxy is not None else TokenCounter()
        self._rewriter = Rewriter()

    def store(self, settings: Settings) -> SQLiteMemoryStore:
        cfg = settings.config
        if self._store is None or self._store.path != cfg.memory.store.path:
            self._store = SQLiteMemoryStore(cfg.memory.store.path, limits=settings.memory_limits)
        self._store.limits = settings.memory_limits  # the config may have been edited
        return self._store

    def analysis(self, settings: Settings, *, days: float) -> dict[str, Any]:
        """`ctxbudget analyze` over the last `days`, for the report (every owner)."""
        return analysis(self.store(settings), settings.config, days=days)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()

    async def rewrite(
        self,
        messages: list[Any],
        owner: str,
        settings: Settings,
        *,
        requested: str | None,
        env: Mapping[str, str],
    ) -> tuple[list[str], str | None]:
        """Deep recall's LLM rewrite of the query, when configured: words, and where from."""
        cfg = settings.config.memory
        if cfg.rewrite is None or not cfg.inject.enabled:
            return [], None
        found = latest_user(messages)
        query = clean(found[1]) if found else ""
        if not query or not self.store(settings).has_any(owner):
            return [], None
        profile, _ = choose(requested or cfg.inject.budget, query)  # type: ignore[arg-type]
        if profile.name != "deep":
            return [], None
        return await self._rewriter.words(query, cfg.rewrite, env)

    def recall_into(
        self,
        messages: list[Any],
        owner: str,
        settings: Settings,
        *,
        budget_on: bool,
        agent: str | None,
        requested: str | None,
        complexity: str | None = None,
        model: str | None = None,
        dry_run: bool = False,
        extra_words: Sequence[str] = (),
        rewrite_note: str | None = None,
    ) -> tuple[list[Any], dict[str, Any] | None]:
        """`messages` with recalled memories placed, and what recall did (None: nothing to do)."""
        cfg = settings.config.memory.inject
        if not cfg.enabled:
            return messages, None
        found = latest_user(messages)
        if found is None:
            return messages, None
        index, raw_text = found
        query = clean(raw_text)
        if not query:
            return messages, None
        store = self.store(settings)
        if not store.has_any(owner):
            return messages, None
        profile, reason = choose(requested or cfg.budget, query)  # type: ignore[arg-type]
        cap = settings.caps.memory_max_chars if budget_on else None
        feature = settings.config.memory.qmd.limits.max_injected_chars
        max_chars = min(cap, feature) if cap is not None else feature
        now = time.time()
        budgets = settings.config.memory.budgets
        agent_name = agent or budgets.default_agent
        budget_name = budgets.agents.get(agent_name, budgets.default_profile)
        configured = budgets.profiles.get(budget_name)
        agent_profile = (
            AgentProfile(
                tokens=configured.tokens,
                max_tokens=configured.max_tokens,
                scope_weights=dict(configured.scope_weights),
            )
            if configured
            else DEFAULT_PROFILES["specialist-narrow"]
        )
        tier: Complexity
        if complexity:  # validated by the app
            tier, tier_reason = cast(Complexity, complexity), "x-context-budget-complexity header"
        else:
            tier, tier_reason = detect(query)
            if not dry_run and store.monitor.take_bump(owner, agent_name):
                tier = bump(tier)
                tier_reason += "; bumped a tier: the agent's last request exceeded its budget"
        encoding = settings.encoding_for(model)
        system = "".join(
            m["content"]
            for m in messages
            if isinstance(m, dict)
            and m.get("role") in ("system", "developer")
            and isinstance(m.get("content"), str)
        )
        decision = decide(
            agent=agent_name,
            profile_name=budget_name,
            profile=agent_profile,
            complexity=tier,
            complexity_reason=tier_reason,
            context_window=context_window(model, budgets.context_windows),
            system_tokens=self._tokens.count(system, encoding),
        )
        result = recall(
            store,
            owner,
            query,
            profile,
            reason,
            limits=settings.memory_limits,
            now=now,
            max_chars=max_chars,
            count_tokens=lambda text: self._tokens.count(text, encoding),
            max_tokens=decision.tokens,
            scope=agent,
            scope_weights=agent_profile.scope_weights,
            extra_words=extra_words,
            format_line=lambda m: line(m, now=now),
        )
        dropped_ids = {c.memory.id for c, _ in result.dropped}
        loaded = [c for c in result.candidates if c.memory.id not in dropped_ids]
        per_scope: dict[str, int] = {}
        for c in loaded:
            key = scope_of(c.memory.scope, c.memory.category)
            per_scope[key] = per_scope.get(key, 0) + self._tokens.count(
                line(c.memory, now=now), encoding
            )
        usage = Usage(
            ts=now,
            owner=owner,
            agent=agent_name,
            budget_profile=budget_name,
            retrieval_profile=result.profile,
            complexity=tier,
            budget=decision.tokens,
            tokens_loaded=sum(per_scope.values()),
            tokens_injected=result.tokens,
            per_scope=per_scope,
        )
        if not dry_run:
            store.monitor.record(usage)
        lines = [line(c.memory, now=now) for c in result.chosen]
        if result.chosen and not dry_run:
            turn = f"{index}:{hashlib.sha256(raw_text.encode('utf-8', 'replace')).hexdigest()}"
            store.touch_once(owner, turn, [c.memory.id for c in result.chosen])
        info = {
            "requested": requested or cfg.budget,
            "applied": result.profile,
            "reason": result.reason,
            "candidates": len(result.candidates),
            "injected": len(result.chosen),
            "dropped": [{"id": c.memory.id, "why": why} for c, why in result.dropped],
            "chars": result.chars,
            "maxChars": max_chars,
            "tokens": result.tokens,
            "budget": decision.to_dict(),
            "usage": {
                k: v
                for k, v in usage.to_dict().items()
                if k in ("tokensLoaded", "usagePercent", "perScope", "exceeded", "warnings")
            },
            "boundBy": result.bound_by,
            "scopes": result.scopes,
            "tooCommonWords": len(result.skipped),
            "placement": cfg.placement,
            # ids and score signals only: the report is shared, memory text is its owner's
            "memories": [{"id": c.memory.id, **c.signals()} for c in result.chosen],
        }
        if rewrite_note is not None:
            info["rewrite"] = rewrite_note
        if dry_run:  # the CLI, for the person who typed the query: the words themselves
            info["tooCommonWords"] = [{"word": w, "memories": n} for w, n in result.skipped]
        return inject(messages, lines, cfg.placement), info

    def _owner(self, request: Request, settings: Settings, asked: Any) -> str:
        if asked is not None and not isinstance(asked, str):
            raise BadRequest(f"owner must be a string, got {type(asked).__name__}", param="owner")
        if settings.admin_key:
            given = request.headers.get("authorization", "").partition(" ")[2].strip()
            if not secrets.compare_digest(given, settings.admin_key):
                raise Unauthorized(
                    "memory endpoints need the admin key: send 'Authorization: Bearer <key>' "
                    f"with the key in ${settings.config.proxy.admin_key_env}"
                )
            return asked or DEFAULT_OWNER
        owner = self.proxy.check_key(request, settings)
        if asked not in (None, owner):
            raise Forbidden(
                f"this key acts for owner {owner!r}, not {asked!r}; use the admin key to manage "
                "other owners' memories",
                param="owner",
            )
        return owner

    async def add(self, request: Request) -> Response:
        settings = self.proxy.settings()
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"request body is not valid JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise BadRequest('send a JSON object: {"text": ..., "category": ...}')
        unknown = sorted(set(body) - _FIELDS)
        if unknown:
            raise BadRequest(
                f"unknown field(s) {', '.join(unknown)}: a memory has {', '.join(sorted(_FIELDS))}",
                param=unknown[0],
            )
        owner = self._owner(request, settings, body.get("owner"))
        for key in ("text", "category", "source", "scope"):
            if key in body and not isinstance(body[key], str):
                raise BadRequest(f"{key} must be a string", param=key)
        new = NewMemory(
            owner=owner,
            text=body.get("text", ""),
            category=body.get("category", "fact"),
            source=body.get("source", "user_explicit"),
            scope=body.get("scope", "global"),
        )
        store = self.store(settings)
        try:
            added, evicted = await asyncio.to_thread(store.add, new)
        except InvalidMemory as exc:
            raise BadRequest(str(exc)) from exc
        return JSONResponse(
            {"memory": added.to_dict(), "evicted": [m.to_dict() for m in evicted]},
            status_code=201,
        )

    async def list(self, request: Request) -> Response:
        settings = self.proxy.settings()
        params = request.query_params
        owner = self._owner(request, settings, params.get("owner"))
        store = self.store(settings)
        query = params.get("q")
        if query:
            found = await asyncio.to_thread(store.search, owner, query)
            data = [{**m.to_dict(), "relevance": round(score, 4)} for m, score in found]
        else:
            memories = await asyncio.to_thread(store.all, owner, scope=params.get("scope"))
            data = [m.to_dict() for m in memories]
        return JSONResponse({"object": "list", "owner": owner, "data": data})

    async def remove(self, request: Request) -> Response:
        settings = self.proxy.settings()
        owner = self._owner(request, settings, request.query_params.get("owner"))
        raw_id = request.path_params["id"]
        if not raw_id.isdigit():
            raise BadRequest(f"memory id must be a number, got {raw_id!r}", param="id")
        removed = await asyncio.to_thread(self.store(settings).remove, owner, int(raw_id))
        if not removed:
            raise NotFound(f"no memory {raw_id} for owner {owner!r}", param="id")
        return JSONResponse({"id": int(raw_id), "deleted": True})
