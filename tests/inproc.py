"""The proxy in-process: the real ASGI app, a fake upstream, no sockets, no subprocess.

    with proxy_app(tmp_path, {"agents": ...}) as (client, fake):
        r = client.post("/v1/chat/completions", json=body)

`client` sends through `httpx.ASGITransport` into the app, whose lifespan runs on an event
loop of its own thread, as under uvicorn; the report and memory stores are real SQLite files
in `tmp_path`. Responses are read whole (streams too: their bytes are what the client gets).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from starlette.applications import Starlette

from ctxbudget.caps import Clamp, clamp_request
from ctxbudget.proxy.app import create_app
from ctxbudget.proxy.config.schema import Config, ConfigSource
from ctxbudget.proxy.config.settings import Settings, settings_for
from ctxbudget.proxy.pipeline.offload import LARGE_BODY, Offload
from ctxbudget.proxy.report.store import ReportStore, open_db
from ctxbudget.proxy.state import ProxyState
from tests.fakes import FakeUpstream

UPSTREAM = "http://upstream.test/v1"


def config_for(tmp_path: Path, **sections: Any) -> dict[str, Any]:
    """A config with its stores in `tmp_path` and the budget on; `sections` merged over it."""
    config: dict[str, Any] = {
        "proxy": {"upstream": {"baseUrl": UPSTREAM, "apiKeyEnv": None}},
        "agents": {"defaults": {"contextBudget": {"enabled": True}}},
        "report": {"path": str(tmp_path / "report.db")},
        "memory": {"store": {"path": str(tmp_path / "memory.db")}},
    }
    _merge(config, sections)
    return config


CUTTING = {"webFetchMaxChars": 1200, "toolOutputMaxChars": 900, "bootstrapMaxChars": 1500}
"""Caps that cut most of a grown OpenClaw conversation's results (`bench/_growing.py`)."""


def cutting_config(
    tmp_path: Path, *, enabled: bool = True, pruning: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`config_for` with the `CUTTING` caps (budget `enabled`, `pruning` as given) and no
    memory placed: what is forwarded depends on the request alone."""
    defaults: dict[str, Any] = {"contextBudget": {"enabled": enabled, **CUTTING}}
    if pruning is not None:
        defaults["contextPruning"] = pruning
    memory = {"inject": {"enabled": False}}
    return config_for(tmp_path, agents={"defaults": defaults}, memory=memory)


class Counted:
    """Calls of functions (each looking at one item, block or segment), by name."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: dict[str, int] = {}
        self._patch = monkeypatch

    def count(self, owner: Any, name: str) -> None:
        real = getattr(owner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return real(*args, **kwargs)

        self._patch.setattr(owner, name, counted)


def settings(env: Mapping[str, str] | None = None, **proxy: Any) -> Settings:
    """`Settings` for a config whose `proxy` section is `proxy` (proxy keys from $KEYS)."""
    config = Config.model_validate({"proxy": {"keysEnv": "KEYS", **proxy}})
    return settings_for(config, env or {})


def _merge(into: dict[str, Any], more: Mapping[str, Any]) -> None:
    for key, value in more.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


_T = TypeVar("_T")


class InProcess:
    """A synchronous httpx-style client for an ASGI app, its lifespan running."""

    def __init__(self, app: Starlette) -> None:
        self.app = app
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._lifespan = app.router.lifespan_context(app)
        self._run(self._lifespan.__aenter__())
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        self._client = httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:4141")

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=60)

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        return self._run(self._client.request(method, url, **kwargs))

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", url, **kwargs)

    def delete(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("DELETE", url, **kwargs)

    def settle(self) -> None:
        """Wait for the work an answer left running in the background (pruning's summaries),
        then for the report's writer to store everything queued."""
        self._run(self.app.state.pipeline.prune.summarizer.idle())
        self.app.state.proxy.reports.flush()

    def close(self) -> None:
        try:
            self._run(self._client.aclose())
            self._run(self._lifespan.__aexit__(None, None, None))
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()


_OFFLOADS: dict[int, Offload] = {}


def shared_offload(threshold: int = LARGE_BODY) -> Offload:
    """One offload worker per threshold for the whole test run (`close_offloads` stops them):
    starting one per test costs ~1 s of interpreter start and imports. Tests that stop, kill
    or hold their worker make their own, and are marked `e2e`."""
    found = _OFFLOADS.get(threshold)
    if found is None:
        found = _OFFLOADS[threshold] = Offload(threshold=threshold)
    return found


def close_offloads() -> None:
    for offload in _OFFLOADS.values():
        asyncio.run(offload.close())
    _OFFLOADS.clear()


_SCHEMA: list[Path] = []
"""A report database `open_db` created for the run (`_new_report`)."""


def _new_report(path: Path) -> None:
    """A new report database at `path`: a copy of one `open_db` created for the run. Each app
    opened a new file and walked every step of the report's schema (~60 statements, each
    re-reading the schema: ~12 ms, ~370 apps a run); the copy is the same file, at
    `SCHEMA_VERSION`, and `open_db` takes it as it takes a file an earlier run made. The
    migrations themselves are tested on the files their tests write
    (`tests/proxy/report/test_report.py`)."""
    if not _SCHEMA:
        folder = Path(tempfile.mkdtemp(prefix="ctxbudget-schema-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        open_db(folder / "report.db").close()
        _SCHEMA.append(folder / "report.db")
    shutil.copyfile(_SCHEMA[0], path)


@contextmanager
def proxy_app(
    tmp_path: Path,
    config: dict[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    clamp: Clamp = clamp_request,
    upstream: FakeUpstream | None = None,
    run: str = "test",
    offload: Offload | None = None,
    clock: Callable[[], float] = time.time,
    reports: ReportStore | None = None,
) -> Iterator[tuple[InProcess, FakeUpstream]]:
    """The app with `config` (default `config_for(tmp_path)`) in front of a fake upstream;
    large bodies go to `offload`, else to the run's shared worker; `reports`, when given, is
    the report store (the caller closes it)."""
    path = tmp_path / "ctxbudget.json"
    config = config if config is not None else config_for(tmp_path)
    path.write_text(json.dumps(config))
    report = config.get("report", {}).get("path")
    if isinstance(report, str) and reports is None:
        new = Path(report)
        if new.parent.is_dir() and not new.exists():  # a missing folder is the app's to make
            _new_report(new)
    fake = upstream or FakeUpstream()
    app = create_app(
        ConfigSource(path, env or {}, {}),
        upstream=fake,
        env=env or {},
        clamp=clamp,
        run=run,
        offload=offload or shared_offload(),
        clock=clock,
        reports=reports,
    )
    client = InProcess(app)
    try:
        yield client, fake
    finally:
        client.close()


def state_of(client: InProcess) -> ProxyState:
    """The app's shared state (its report store, memory, settings)."""
    state: ProxyState = client.app.state.proxy
    return state
