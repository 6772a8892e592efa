"""What the request path needs from a config, computed once per config version.

The config file can change under a running server; `Proxy.settings()` rebuilds this only when
`ConfigSource.get()` hands back a new config, so the per-request cost is one identity check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from ctxbudget.caps import Caps, PrunePolicy, ToolNames
from ctxbudget.memory import MemoryLimits
from ctxbudget.memory.budget import BudgetProfile
from ctxbudget.memory.recaller import RecallSettings
from ctxbudget.proxy.config.schema import (
    Config,
    ConfigSource,
    DatabaseConfig,
    RewriteConfig,
    RouteConfig,
    admin_key,
    anthropic_api_key,
    effective_caps,
    is_loopback,
    memory_limits,
    metrics_key,
    proxy_keys,
    seconds,
    tool_names,
    upstream_api_key,
)
from ctxbudget.proxy.tokens import encoding_name
from ctxbudget.proxy.urls import join, split_base


@dataclass(frozen=True, kw_only=True)
class Pruning:
    """When pruning runs (`agents.defaults.contextPruning`; what it takes: `policy`)."""

    mode: Literal["cache-ttl", "pays"]
    ttl_seconds: float
    """The cache lifetime a session's idle time is measured against (unless a request asks
    for a longer one)."""
    policy: PrunePolicy
    summarize_model: str | None = None
    summarize_min_chars: int = 20000


def pruning_of(config: Config) -> Pruning | None:
    found = config.agents.defaults.context_pruning
    if found.mode == "off":
        return None
    return Pruning(
        mode=found.mode,
        ttl_seconds=seconds(found.ttl),
        policy=PrunePolicy(
            keep_last_assistants=found.keep_last_assistants,
            min_chars=found.min_prunable_tool_chars,
            soft_max_chars=found.soft_trim.max_chars,
            head_chars=found.soft_trim.head_chars,
            tail_chars=found.soft_trim.tail_chars,
            hard_clear=found.hard_clear.enabled,
            placeholder=found.hard_clear.placeholder,
            allow=tuple(found.tools.allow),
            deny=tuple(found.tools.deny),
        ),
        summarize_model=found.summarize.model,
        summarize_min_chars=found.summarize.min_chars,
    )


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Derived, ready-to-use values of one config version: all the request path reads."""

    enabled: bool
    fail_closed: bool
    holdout: float = 0.0
    """`contextBudget.holdout`: the share of new conversations drawn into the holdout arm."""
    caps: Caps
    cap_sources: dict[str, Any]
    tool_names: ToolNames
    upstream_base: str
    """`proxy.upstream.baseUrl` without its query (nor a trailing `/`): paths go after it."""
    upstream_query: str = field(repr=False)
    """`proxy.upstream.baseUrl`'s own query string, kept on every upstream URL."""
    upstream_api_key: str | None = field(repr=False)
    anthropic_base: str
    anthropic_query: str = field(repr=False)
    """`proxy.anthropic.baseUrl`'s own query string, kept on every upstream URL."""
    anthropic_api_key: str | None = field(repr=False)
    proxy_keys: dict[str, str] = field(repr=False)
    """Proxy key → the owner it stands for."""
    admin_key: str | None = field(repr=False)
    metrics_key: str | None = field(repr=False)
    """The key that may read `/metrics` only."""
    proxy_keys_env: str
    admin_key_env: str
    metrics_key_env: str
    listen_host: str
    listen_loopback: bool
    """Whether `listen_host` is this machine only (the guard then serves localhost names)."""
    allowed_hosts: frozenset[str]
    """Lower-cased `proxy.allowedHosts`."""
    allowed_origins: frozenset[str]
    """Lower-cased `proxy.allowedOrigins`, without a trailing slash."""
    routes: Mapping[str, RouteConfig]
    connect_timeout: float
    read_timeout: float
    max_body_bytes: int
    recent_requests: int
    default_encoding: str
    memory_limits: MemoryLimits
    memory_path: Path
    memory_feature_chars: int
    """The memory feature limit (`memory.qmd.limits.maxInjectedChars`): the cap with the
    budget off."""
    recall: RecallSettings
    rewrite: RewriteConfig | None
    context_windows: Mapping[str, int]
    report_path: Path
    report_keep_days: float
    request_usage: bool = True
    """`report.requestUsage`: ask for usage on chat streams whose client did not."""
    database: DatabaseConfig = field(default_factory=DatabaseConfig)
    """`database`: when its url is set, memories and the monitor live there (the report too)."""
    pruning: Pruning | None = None
    """`agents.defaults.contextPruning` when its mode is not off (with the budget on)."""
    _encodings: dict[str | None, str] = field(default_factory=dict, repr=False)
    _owned_caps: dict[str, Caps] = field(default_factory=dict, repr=False)

    def caps_for(self, owner: str) -> Caps:
        """`caps` for `owner`'s requests: what the clamps remember is found by owner too
        (`Caps.owner`). One per owner and config version (owners are the configured keys),
        so a request neither makes one nor hashes it again."""
        found = self._owned_caps.get(owner)
        if found is None:
            found = self._owned_caps[owner] = replace(self.caps, owner=owner)
        return found

    def upstream_url(self, path: str, query: str = "") -> str:
        """`proxy.upstream.baseUrl` + `path`, its own query and then the client's `query`."""
        return join(self.upstream_base, path, self.upstream_query, query)

    def route_for(self, model: str | None) -> RouteConfig | None:
        if model is None or not self.routes:
            return None
        return self.routes.get(model)

    def encoding_for(self, model: str | None) -> str:
        """The tiktoken encoding name for `model` (memoised per config version)."""
        found = self._encodings.get(model)
        if found is None:
            found = encoding_name(model, self.default_encoding)
            self._encodings[model] = found
        return found

    def memory_max_chars(self, budget_on: bool) -> int:
        """The char cap on injected memories: the effective cap with the budget on, else the
        feature limit."""
        cap = self.caps.memory_max_chars if budget_on else None
        return self.memory_feature_chars if cap is None else cap

    def report_section(self, source: ConfigSource) -> dict[str, Any]:
        """The settings part of the report. Never includes a secret."""
        loaded = datetime.fromtimestamp(source.loaded_at, UTC).isoformat(timespec="seconds")
        return {
            "enabled": self.enabled,
            "config": {
                "path": str(source.path) if source.path else None,
                "loadedAt": loaded.replace("+00:00", "Z"),
                "error": source.error,
            },
            "caps": self.cap_sources,
            "encoding": self.default_encoding,
            "keepDays": self.report_keep_days,
        }


def settings_for(config: Config, env: Mapping[str, str]) -> Settings:
    """Derive `Settings` from `config` and the environment (for secrets)."""
    effective = effective_caps(config)
    budget = config.agents.defaults.context_budget
    upstream = config.proxy.upstream
    upstream_base, upstream_query = split_base(upstream.base_url)
    anthropic_base, anthropic_query = split_base(config.proxy.anthropic.base_url)
    memory = config.memory
    budgets = memory.budgets
    pruning = pruning_of(config)
    return Settings(
        enabled=budget.enabled,
        fail_closed=budget.fail_closed,
        holdout=budget.holdout,
        caps=replace(effective.caps, prune=pruning.policy) if pruning else effective.caps,
        cap_sources=effective.sources,
        tool_names=tool_names(config),
        upstream_base=upstream_base,
        upstream_query=upstream_query,
        upstream_api_key=upstream_api_key(config, env),
        anthropic_base=anthropic_base,
        anthropic_query=anthropic_query,
        anthropic_api_key=anthropic_api_key(config, env),
        proxy_keys=proxy_keys(config, env),
        admin_key=admin_key(config, env),
        metrics_key=metrics_key(config, env),
        proxy_keys_env=config.proxy.keys_env,
        admin_key_env=config.proxy.admin_key_env,
        metrics_key_env=config.proxy.metrics_key_env,
        listen_host=config.proxy.host,
        listen_loopback=is_loopback(config.proxy.host),
        allowed_hosts=frozenset(h.lower() for h in config.proxy.allowed_hosts),
        allowed_origins=frozenset(o.rstrip("/").lower() for o in config.proxy.allowed_origins),
        routes=config.proxy.routes,
        connect_timeout=upstream.connect_timeout_seconds,
        read_timeout=upstream.read_timeout_seconds,
        max_body_bytes=config.proxy.max_body_bytes,
        recent_requests=config.report.recent_requests,
        default_encoding=config.report.default_encoding,
        memory_limits=memory_limits(config),
        memory_path=memory.store.path,
        memory_feature_chars=memory.qmd.limits.max_injected_chars,
        recall=RecallSettings(
            inject=memory.inject.enabled,
            profile=memory.inject.budget,
            placement=memory.inject.placement,
            budget_profiles={
                name: BudgetProfile(
                    tokens=p.tokens, max_tokens=p.max_tokens, scope_weights=dict(p.scope_weights)
                )
                for name, p in budgets.profiles.items()
            },
            agents=dict(budgets.agents),
            default_budget_profile=budgets.default_profile,
            default_agent=budgets.default_agent,
        ),
        rewrite=memory.rewrite,
        context_windows=dict(budgets.context_windows),
        report_path=config.report.path,
        report_keep_days=config.report.keep_days,
        request_usage=config.report.request_usage,
        database=config.database,
        pruning=pruning,
    )
