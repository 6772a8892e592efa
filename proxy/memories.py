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
import secrets
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from memory import DEFAULT_OWNER, InvalidMemory, NewMemory, SQLiteMemoryStore
from proxy.errors import BadRequest, Forbidden, NotFound, Unauthorized

if TYPE_CHECKING:
    from proxy.app import Proxy
    from proxy.settings import Settings

_FIELDS = {"text", "category", "source", "scope", "owner"}


class MemoryRoutes:
    """The memory endpoints of one app; the store opens on first use."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self._store: SQLiteMemoryStore | None = None

    def store(self, settings: Settings) -> SQLiteMemoryStore:
        cfg = settings.config
        if self._store is None or self._store.path != cfg.memory.store.path:
            self._store = SQLiteMemoryStore(cfg.memory.store.path, limits=settings.memory_limits)
        self._store.limits = settings.memory_limits  # the config may have been edited
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()

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
