"""What every route of one app shares: config, upstream, report store, memory, tokens."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from ctxbudget.caps import Clamp, Memo, clamp_request, remembering
from ctxbudget.proxy.cache.mirrors import Mirrors
from ctxbudget.proxy.cache.sessions import SessionTracker
from ctxbudget.proxy.config.schema import ConfigSource
from ctxbudget.proxy.config.settings import Settings, settings_for
from ctxbudget.proxy.report import ReportStore
from ctxbudget.proxy.stores import MemoryStores
from ctxbudget.proxy.tokens import TokenCounter
from ctxbudget.proxy.upstream.http import UpstreamClient
from ctxbudget.proxy.wire.conversations import Conversations


class ProxyState:
    """The app's dependencies, injected by `create_app`, and the settings in force."""

    def __init__(
        self,
        config: ConfigSource,
        *,
        upstream: UpstreamClient,
        reports: ReportStore,
        env: Mapping[str, str],
        clamp: Clamp = clamp_request,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.clock = clock
        """When a request comes (epoch seconds): what pruning measures a session's idle time
        by. A replay of a recorded session gives its own."""
        self.upstream = upstream
        self.reports = reports
        self.env = env
        self.memo = Memo()
        """What the clamps remember between this app's requests (`caps.Memo`): this app's
        alone, let go when it closes."""
        self.clamp = remembering(clamp, self.memo)
        """The clamp given to `create_app`, remembering in `memo` (pickled for the offload
        worker, it is the clamp alone: the worker remembers in its own)."""
        self.conversations = Conversations()
        """What is known of each owner's conversations' previous requests (the items read,
        what each stage decided for them): this app's alone, let go when it closes."""
        self.tokens = TokenCounter()  # counts are cached per text, shared by every stage
        self.stores = MemoryStores(env)
        """The memory store of the settings in force (recall, `/v1/memories`, the report)."""
        self.refuses_usage: set[str] = set()
        """Upstream URLs that answered 400 to `stream_options`: not asked for usage again."""
        self.sessions = SessionTracker()
        """Each recent session's previous request: cache busts, memory placed again."""
        self.mirrors = Mirrors()
        """Each recent session's provider cache, as sent and as the client sent it."""
        self._settings: tuple[int, Settings] | None = None

    def settings(self) -> Settings:
        """Settings derived from the current config, recomputed only when it changes."""
        cfg = self.config.get()
        cached = self._settings
        if cached is None or cached[0] != id(cfg):
            cached = (id(cfg), settings_for(cfg, self.env))
            self._settings = cached
        return cached[1]
