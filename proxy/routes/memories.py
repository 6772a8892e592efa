"""`/v1/memories`: people add, list, search and remove memories over HTTP.

Who may act for whom:
- the admin key is configured (`proxy.adminKeyEnv`): it is required, and `owner` chooses the
  owner (default `default`);
- else proxy keys are configured: a client acts for its own key's owner only;
- else (a personal setup) there is one owner, `default`.

The caller is authenticated before the body is read, and bodies are small (`MAX_BODY_BYTES`).
Chat requests never write memories; only these routes and `ctxbudget memory` do. The store is
SQLite: every call runs in a worker thread.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from memory import DEFAULT_OWNER, InvalidMemory, NewMemory
from memory.store import search_rows
from memory.types import unstorable
from proxy.access.auth import is_admin, owner_for
from proxy.config.settings import Settings
from proxy.errors import BadRequest, Forbidden, NotFound, Unauthorized
from proxy.state import ProxyState
from proxy.wire.body import read_body

MAX_BODY_BYTES = 8 * 1024 * 1024
"""Largest memory request accepted: a list of a few thousand memories (read only after the
caller is authenticated)."""
_FIELDS = {"text", "category", "source", "scope", "owner"}


class MemoryRoutes:
    """The memory endpoints of one app."""

    def __init__(self, state: ProxyState) -> None:
        self.state = state

    def _caller(self, request: Request, settings: Settings) -> str | None:
        """Authenticate: None for the admin, else the owner the caller's key acts for."""
        if settings.admin_key:
            if not is_admin(request.headers, settings):
                raise Unauthorized(
                    "memory endpoints need the admin key: send 'Authorization: Bearer <key>' "
                    f"with the key in ${settings.admin_key_env}"
                )
            return None
        return owner_for(request.headers, settings)

    @staticmethod
    def _owner(caller: str | None, asked: Any) -> str:
        """The owner to act on: the admin's choice, or the caller's own."""
        if asked is not None and not isinstance(asked, str):
            raise BadRequest(f"owner must be a string, got {type(asked).__name__}", param="owner")
        _storable("owner", asked)
        if caller is None:
            return asked or DEFAULT_OWNER
        if asked not in (None, caller):
            raise Forbidden(
                f"this key acts for owner {caller!r}, not {asked!r}; use the admin key to manage "
                "other owners' memories",
                param="owner",
            )
        return caller

    async def add(self, request: Request) -> Response:
        settings = self.state.settings()
        caller = self._caller(request, settings)
        raw = await read_body(
            request,
            MAX_BODY_BYTES,
            over="over the memory routes' limit ({limit:,} bytes): send fewer memories at once",
        )
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"request body is not valid JSON: {exc}") from exc
        if isinstance(body, list):
            return await self._add_many(settings, caller, body, request)
        if not isinstance(body, dict):
            raise BadRequest('send a JSON object {"text": ..., "category": ...}, or a list of them')
        unknown = sorted(set(body) - _FIELDS)
        if unknown:
            raise BadRequest(
                f"unknown field(s) {', '.join(unknown)}: a memory has {', '.join(sorted(_FIELDS))}",
                param=unknown[0],
            )
        owner = self._owner(caller, body.get("owner"))
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
        stores = self.state.stores
        try:
            added, evicted = await asyncio.to_thread(lambda: stores.store(settings).add(new))
        except InvalidMemory as exc:
            raise BadRequest(str(exc)) from exc
        stores.added(new.owner)
        return JSONResponse(
            {"memory": added.to_dict(), "evicted": [m.to_dict() for m in evicted]},
            status_code=201,
        )

    async def _add_many(
        self, settings: Settings, caller: str | None, items: list[Any], request: Request
    ) -> Response:
        """A list: all added in one transaction, or a 400 naming the bad item and none."""
        from memory.transfer import from_dict

        owner = self._owner(caller, request.query_params.get("owner"))
        new = []
        for number, item in enumerate(items, 1):
            if not isinstance(item, dict):
                raise BadRequest(
                    f"item {number}: send an object with a text", param=f"[{number - 1}]"
                )
            if item.get("owner") not in (None, owner):
                raise BadRequest(
                    f"item {number}: a list is added for one owner (?owner=), not per item",
                    param=f"[{number - 1}].owner",
                )
            try:
                new.append(from_dict(item, owner).validate(settings.memory_limits))
            except InvalidMemory as exc:
                raise BadRequest(f"item {number}: {exc}", param=f"[{number - 1}]") from None
        stores = self.state.stores
        try:
            added, evicted = await asyncio.to_thread(lambda: stores.store(settings).add_many(new))
        except InvalidMemory as exc:
            raise BadRequest(f"nothing added: {exc}") from exc
        for memory in new:
            stores.added(memory.owner)
        return JSONResponse(
            {
                "object": "list",
                "owner": owner,
                "data": [m.to_dict() for m in added],
                "evicted": [m.to_dict() for m in evicted],
            },
            status_code=201,
        )

    async def list(self, request: Request) -> Response:
        settings = self.state.settings()
        params = request.query_params
        owner = self._owner(self._caller(request, settings), params.get("owner"))
        stores = self.state.stores
        query = _storable("q", params.get("q"))
        data: list[dict[str, Any]]
        if query:
            found = await asyncio.to_thread(lambda: stores.store(settings).search(owner, query))
            data = search_rows(found)  # relevance 0-100, the best hit 100; and `bm25`
        else:
            scope = _storable("scope", params.get("scope"))
            listed = await asyncio.to_thread(lambda: stores.store(settings).all(owner, scope=scope))
            data = [m.to_dict() for m in listed]
        return JSONResponse({"object": "list", "owner": owner, "data": data})

    async def remove(self, request: Request) -> Response:
        settings = self.state.settings()
        owner = self._owner(self._caller(request, settings), request.query_params.get("owner"))
        raw_id = request.path_params["id"]
        # isdigit() alone takes "²"; 18 digits keep it inside SQLite's 64-bit integers
        if not (raw_id.isascii() and raw_id.isdigit() and len(raw_id) <= 18):
            raise BadRequest(f"memory id must be a number, got {raw_id[:40]!r}", param="id")
        stores = self.state.stores
        removed = await asyncio.to_thread(lambda: stores.store(settings).remove(owner, int(raw_id)))
        if not removed:
            raise NotFound(f"no memory {raw_id} for owner {owner!r}", param="id")
        return JSONResponse({"id": int(raw_id), "deleted": True})


def _storable(name: str, value: str | None) -> str | None:
    """`value` of parameter `name`, or a 400 naming it when no database could hold it (a NUL:
    PostgreSQL's text refuses one, and the route answered 500)."""
    problem = unstorable(name, value)
    if problem is not None:
        raise BadRequest(problem, param=name)
    return value
