"""Configuration: one pydantic schema, read from JSONC, the environment and CLI flags.

Precedence, highest first: **CLI flag → environment variable → config file → default.**

- The file is JSONC/JSON5 (parsed with the `json5` library), keys in camelCase as in OpenClaw.
- Environment variables `CTXBUDGET__<PATH>` override single keys: levels joined by `__`, each
  level in UPPER_SNAKE (`CTXBUDGET__PROXY__PORT=5000`,
  `CTXBUDGET__AGENTS__DEFAULTS__CONTEXT_BUDGET__ENABLED=true`). Values are read as JSON5
  scalars when they are one (`true`, `8000`, `null`, `"text"`), else as plain strings.
- CLI flags arrive as dotted paths (`{"proxy.port": 0}`).
- Secrets never live in the file: it names the environment variable that holds each one.

Unknown keys are errors naming the key's full path; file values are checked strictly (the
string `"8000"` is not an integer). All problems are reported at once.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import ipaddress
import json
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import json5
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from yarl import URL

from ctxbudget.caps import KEEP_WHOLE, Caps, ToolNames
from ctxbudget.memory.budget import DEFAULT_PROFILES
from ctxbudget.memory.inject import Placement
from ctxbudget.memory.profiles import RequestedProfile
from ctxbudget.memory.types import MemoryLimits
from ctxbudget.proxy.errors import ConfigError
from ctxbudget.proxy.urls import redact

log = logging.getLogger("ctxbudget.config")

ENV_PREFIX = "CTXBUDGET__"
DATABASE_URL_ENV = "CTXBUDGET_DATABASE_URL"


def _expand(value: Any) -> Any:
    return Path(value).expanduser() if isinstance(value, str) else value


def _in_home(name: str) -> Any:
    # Resolved when a config is loaded, not at import: `~` is the home of that moment.
    return Field(default_factory=lambda: Path("~/.ctxbudget", name).expanduser())


FilePath = Annotated[Path, BeforeValidator(_expand), Field(strict=False)]


def _has_scheme(value: str) -> str:
    # "127.0.0.1:18555" loads fine and then fails every request: say so at load.
    if not value.lower().startswith(("http://", "https://")):
        shown = redact("http://" + value).removeprefix("http://")  # no `user:key@` shown
        raise ValueError(
            f"must start with http:// or https://, got {shown!r}: write "
            f"'http://{shown}' (or https:// for a remote provider)"
        )
    try:
        host = URL(value, encoded=True).raw_host
    except ValueError as exc:  # a port that is not a number, or out of range
        raise ValueError(f"is not a valid URL ({exc}): got {redact(value)!r}") from None
    if not host:
        raise ValueError(f"names no host: got {redact(value)!r}")
    return value


BaseUrl = Annotated[str, Field(min_length=1), AfterValidator(_has_scheme)]


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        strict=True,
        alias_generator=to_camel,
        populate_by_name=True,
        validate_default=True,
        use_attribute_docstrings=True,
    )


class UpstreamConfig(_Model):
    base_url: BaseUrl = "https://api.openai.com/v1"
    """OpenAI-compatible base URL; requests go to `<baseUrl>/chat/completions`. A query string
    (`…/v1?api-version=X`) is kept after each path; user info (`https://user:pw@host`) is sent
    as HTTP Basic on requests that carry no `Authorization` of their own (the upstream key's
    or the client's)."""
    api_key_env: str | None = "OPENAI_API_KEY"
    """Environment variable holding the upstream key; when set, it replaces the client's."""
    connect_timeout_seconds: float = Field(10.0, gt=0)
    """Seconds to wait for a connection to the upstream (502 after)."""
    read_timeout_seconds: float = Field(600.0, gt=0)
    """Seconds to wait for each read from the upstream (504 after)."""


class AnthropicConfig(_Model):
    base_url: BaseUrl = "https://api.anthropic.com"
    """Anthropic Messages upstream; requests go to `<baseUrl>/v1/messages` (timeouts are
    `proxy.upstream`'s; a query string and user info as for `proxy.upstream.baseUrl`)."""
    api_key_env: str | None = "ANTHROPIC_API_KEY"
    """Environment variable holding the Anthropic key; when set, it replaces the client's
    `x-api-key`."""


class RouteConfig(_Model):
    model: str = Field(pattern=r"^[A-Za-z0-9_.-]+/.+")
    """litellm model string with its provider prefix, e.g. `anthropic/claude-sonnet-4-5`."""
    api_base: str | None = None
    """Provider base URL, when not the provider's default."""
    api_key_env: str | None = None
    """Environment variable holding this provider's key."""


class LimitsConfig(_Model):
    header_timeout_seconds: float | None = Field(20.0, gt=0)
    """Seconds from a request's first byte for its request line and headers to arrive (408
    after; null: no limit)."""
    body_timeout_seconds: float | None = Field(20.0, gt=0)
    """Seconds a request body may take, plus one for every `bodyMinBytesPerSecond` bytes
    received: a steady upload is never cut, a trickle is (408 after; null: no limit)."""
    body_min_bytes_per_second: int = Field(500, ge=0)
    """Bytes of body that earn one more second (0: `bodyTimeoutSeconds` is the whole body's)."""
    keep_alive_timeout_seconds: int = Field(5, ge=1)
    """Seconds a connection may wait, idle, for its next request (or its first) before it is
    closed."""
    max_connections_per_client: int | None = Field(128, ge=1)
    """Connections one peer address may hold at once, per worker process; one more gets 503
    (null: no cap, for behind a reverse proxy, where every client is its address)."""


class ProxyConfig(_Model):
    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = Field(4141, ge=0, le=65535)
    """Port to listen on (0 picks a free one)."""
    upstream: UpstreamConfig = UpstreamConfig()
    """The OpenAI-compatible provider requests are forwarded to."""
    anthropic: AnthropicConfig = AnthropicConfig()
    """Where Anthropic Messages requests (`/v1/messages`) go."""
    routes: dict[str, RouteConfig] = {}
    """Model name → litellm route, for providers that are not OpenAI-compatible."""
    keys_env: str = "CTXBUDGET_PROXY_KEYS"
    """Environment variable with comma-separated proxy keys; when set, clients must send one."""
    admin_key_env: str = "CTXBUDGET_ADMIN_KEY"
    """Environment variable with the admin key that guards admin endpoints."""
    metrics_key_env: str = "CTXBUDGET_METRICS_KEY"
    """Environment variable with a key that may read `/metrics` only (for a scraper)."""
    allowed_hosts: list[str] = []
    """Host names clients may use besides loopback ones (DNS rebinding guard); beyond
    loopback, when set, the only ones."""
    allowed_origins: list[str] = []
    """Browser origins (`https://app.example`) allowed to call the proxy; others are refused."""
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    """Largest request body accepted (413 above)."""
    limits: LimitsConfig = LimitsConfig()
    """How long a client may take to send a request, and how many connections it may hold
    (read when `serve` starts)."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Log level of the server."""


class ToolNamesConfig(_Model):
    web_fetch: list[str] = ["web_fetch"]
    """Tool names whose results are web_fetch pages."""
    memory_search: list[str] = ["memory_search"]
    """Tool names whose results are memory_search snippets."""
    memory_get: list[str] = ["memory_get"]
    """Tool names whose results are memory_get texts."""
    keep_whole: list[str] = sorted(KEEP_WHOLE)
    """Tools whose results toolOutputMaxChars never cuts: the ones agents edit from."""


class ContextBudgetConfig(_Model):
    enabled: bool = False
    """Clamp requests (true) or only report what would be clamped (false)."""
    bootstrap_max_chars: int = Field(8000, ge=0)
    """Cap per bootstrap file body, UTF-16 chars."""
    memory_max_injected_chars: int = Field(2500, ge=0)
    """Cap per memory tool result (and injected memories), UTF-16 chars."""
    web_fetch_max_chars: int = Field(8000, ge=0)
    """Cap per web_fetch result text, UTF-16 chars."""
    tool_output_max_chars: int = Field(16000, ge=0)
    """Cap per result of any other tool (head + tail kept), UTF-16 chars."""
    clamp_strategy: Literal["query", "head"] = "query"
    """How web_fetch and tool results over their cap are cut: "query" keeps the head and the
    passages that answer the question that led to the call; "head" the head (and tail)."""
    fail_closed: bool = False
    """If a clamp fails: false forwards the request untouched, true answers 500."""
    holdout: float = Field(0.0, ge=0.0, le=0.5)
    """Share of conversations left untouched (as with `enabled: false`), to measure the saving
    on the bill (`docs/holdout.md`); 0 measures nothing."""
    tool_names: ToolNamesConfig = ToolNamesConfig()
    """Which tool names count as which kind."""


def _duration(value: str) -> str:
    if not _DURATION.fullmatch(value.strip()):
        raise ValueError(f"must be a duration such as '90s', '5m' or '1h', got {value!r}")
    return value.strip()


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h)")
Duration = Annotated[str, AfterValidator(_duration)]


def seconds(duration: str) -> float:
    """A `Duration` in seconds: `'90s'` → 90.0, `'5m'` → 300.0, `'1h'` → 3600.0."""
    found = _DURATION.fullmatch(duration.strip())
    if found is None:
        raise ValueError(f"not a duration: {duration!r}")
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[found.group(2)]
    return float(found.group(1)) * scale


class SoftTrimConfig(_Model):
    max_chars: int = Field(4000, ge=0)
    """A pruned result longer than this keeps its head and tail, UTF-16 chars."""
    head_chars: int = Field(1500, ge=0)
    """What a soft trim keeps of the start."""
    tail_chars: int = Field(1500, ge=0)
    """What a soft trim keeps of the end."""


class HardClearConfig(_Model):
    enabled: bool = True
    """A pruned result a soft trim does not take is replaced by the placeholder."""
    placeholder: str = Field("[Old tool result content cleared]", min_length=1)
    """What stands for a cleared result (the tool, call id and size follow it)."""


class PruneToolsConfig(_Model):
    allow: list[str] = []
    """Tool name globs whose results may be pruned; empty: every tool."""
    deny: list[str] = []
    """Tool name globs never pruned (deny wins)."""


class SummarizeConfig(_Model):
    model: str | None = None
    """A model that summarises long results off the request path; a pruned result's summary
    stands for it (opt-in; null: placeholders only)."""
    min_chars: int = Field(20000, ge=0)
    """Results at least this long are summarised."""


class ContextPruningConfig(_Model):
    mode: Literal["off", "cache-ttl", "pays"] = "cache-ttl"
    """When stale tool results are pruned (with the budget on): never; when the session's
    cache has expired anyway; or also when the reads it saves outweigh the rewrite."""
    ttl: Duration = "5m"
    """When a session's cache counts as expired ('90s', '5m', '1h'); a request's own
    cache_control ttl "1h" or prompt_cache_retention "24h" says longer."""
    keep_last_assistants: int = Field(3, ge=0)
    """Results after the newest this many assistant turns are never pruned."""
    min_prunable_tool_chars: int = Field(4000, ge=0)
    """Shorter results are left alone, UTF-16 chars."""
    soft_trim: SoftTrimConfig = SoftTrimConfig()
    """Long pruned results keep head and tail."""
    hard_clear: HardClearConfig = HardClearConfig()
    """The other pruned results become a placeholder."""
    tools: PruneToolsConfig = PruneToolsConfig()
    """Which tools' results may be pruned."""
    summarize: SummarizeConfig = SummarizeConfig()
    """Summaries that stand for pruned results (opt-in)."""


class AgentDefaultsConfig(_Model):
    bootstrap_max_chars: int = Field(20000, gt=0)
    """OpenClaw's per-file bootstrap limit (the feature limit)."""
    bootstrap_total_max_chars: int = Field(60000, gt=0)
    """OpenClaw's total bootstrap limit (reported; the per-file cap is what ctxbudget applies)."""
    context_budget: ContextBudgetConfig = ContextBudgetConfig()
    """The opt-in caps."""
    context_pruning: ContextPruningConfig = ContextPruningConfig()
    """Stale tool results out of long sessions (applies with the budget on)."""


class AgentsConfig(_Model):
    defaults: AgentDefaultsConfig = AgentDefaultsConfig()
    """Defaults for every agent."""


class QmdLimitsConfig(_Model):
    max_injected_chars: int = Field(4000, gt=0)
    """Memory feature limit per memory tool result, UTF-16 chars."""


class QmdConfig(_Model):
    limits: QmdLimitsConfig = QmdLimitsConfig()
    """Memory result limits."""


class MemoryStoreConfig(_Model):
    path: FilePath = _in_home("memory.db")
    """SQLite file of the memory store."""


class MemoryInjectConfig(_Model):
    enabled: bool = True
    """Inject memories into requests."""
    budget: RequestedProfile = "auto"
    """Retrieval profile."""
    placement: Placement = "user"
    """Where the memory block goes: the last user message (cache-safe) or the system prompt."""


class BudgetProfileConfig(_Model):
    tokens: int = Field(gt=0)
    """Memory tokens at medium complexity."""
    max_tokens: int = Field(gt=0)
    """Never more than this, whatever the complexity."""
    scope_weights: dict[str, float]
    """How the budget splits between global, agent_recent and agent_patterns."""


def _default_budget_profiles() -> dict[str, BudgetProfileConfig]:
    return {
        name: BudgetProfileConfig(
            tokens=p.tokens, max_tokens=p.max_tokens, scope_weights=dict(p.scope_weights)
        )
        for name, p in DEFAULT_PROFILES.items()
    }


class BudgetsConfig(_Model):
    profiles: dict[str, BudgetProfileConfig] = Field(default_factory=_default_budget_profiles)
    """Agent budget profiles by name."""
    agents: dict[str, str] = {}
    """Agent name → budget profile name."""
    default_profile: str = "specialist-narrow"
    """Budget profile of agents not listed in `agents`."""
    default_agent: str = "main"
    """Agent of requests without an x-context-budget-agent header or OpenClaw `Runtime: agent=`
    line; its `agent:<name>` memories are recalled."""
    context_windows: dict[str, int] = {}
    """Model → context window in tokens, where litellm's model map does not know it."""

    @model_validator(mode="after")
    def _profiles_exist(self) -> BudgetsConfig:
        # A misspelt profile name would silently budget with another profile's numbers.
        known = sorted(self.profiles)
        named = [("defaultProfile", self.default_profile)]
        named += [(f"agents.{agent}", name) for agent, name in self.agents.items()]
        for where, name in named:
            if name not in self.profiles:
                close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
                hint = f" — did you mean {close[0]}?" if close else ""
                raise ValueError(
                    f"{where} names budget profile {name!r}, which memory.budgets.profiles "
                    f"does not define (it has {', '.join(known)}){hint}"
                )
        return self


class RewriteConfig(RouteConfig):
    timeout_seconds: float = Field(5.0, gt=0)
    """Seconds to wait for the rewrite; past it (or on an error) recall goes on without it."""


class MemoryConfig(_Model):
    qmd: QmdConfig = QmdConfig()
    """Memory limits, named as in OpenClaw."""
    max_chars: int = Field(2000, gt=0)
    """Longest memory text a person may add, in characters."""
    max_memories: int = Field(100, gt=0)
    """Memories kept per owner; past it the least recently used is evicted."""
    categories: dict[str, float] = {"preference": 1.0, "fact": 1.0, "pattern": 0.8}
    """Memory categories and their recall weights."""
    budgets: BudgetsConfig = BudgetsConfig()
    """Agent budget profiles and which agent uses which."""
    store: MemoryStoreConfig = Field(default_factory=MemoryStoreConfig)
    """Where memories are kept."""
    inject: MemoryInjectConfig = MemoryInjectConfig()
    """Memory injection."""
    rewrite: RewriteConfig | None = None
    """LLM query rewrite for the `deep` profile, through litellm (off when not set)."""


class WebFetchConfig(_Model):
    max_chars: int = Field(50000, gt=0)
    """web_fetch feature limit per result, UTF-16 chars."""


class WebConfig(_Model):
    fetch: WebFetchConfig = WebFetchConfig()
    """web_fetch settings."""


class ToolsConfig(_Model):
    web: WebConfig = WebConfig()
    """Web tools."""


class ReportConfig(_Model):
    path: FilePath = _in_home("report.db")
    """SQLite file of the report, shared by every worker."""
    recent_requests: int = Field(50, ge=1, le=1000)
    """How many recent requests the report lists."""
    keep_days: float = Field(90.0, gt=0)
    """Days of history kept (requests, and totals by the hour); older ones are pruned."""
    default_encoding: Literal["o200k_base", "cl100k_base"] = "o200k_base"
    """tiktoken encoding for models tiktoken does not know."""
    request_usage: bool = True
    """Ask the upstream for usage on chat streams whose client did not
    (`stream_options.include_usage`), and drop that usage chunk from what the client sees."""


class DatabaseConfig(_Model):
    url: str | None = None
    """`postgresql://user@host:port/db`: memories, the monitor and the report live there, for
    any number of proxies; None: the SQLite files (`memory.store.path`, `report.path`).
    `$CTXBUDGET_DATABASE_URL` sets it too. Never put the password here: `passwordEnv`."""
    password_env: str | None = None
    """Environment variable holding the database password (read at start)."""
    pool_size: int = Field(10, ge=1, le=200)
    """Connections each proxy process keeps open to the database, at most."""
    connect_timeout_seconds: float = Field(5.0, gt=0, le=120)
    """How long to wait for a connection before the request gets a 503."""

    @field_validator("url")
    @classmethod
    def _postgres_only(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        if not value.startswith(("postgresql://", "postgres://")):
            raise ValueError(
                "must be a postgresql:// URL (or null for the SQLite files), "
                f"got one starting {value.split(':', 1)[0]!r}"
            )
        return value


class TelemetryConfig(_Model):
    enabled: bool | None = None
    """OpenTelemetry export: true, false, or null to follow the OTEL_EXPORTER_OTLP_* variables."""
    endpoint: str | None = None
    """OTLP/HTTP base URL (`/v1/traces`, `/v1/metrics` are added); else OTEL_EXPORTER_OTLP_*."""
    service_name: str | None = None
    """service.name of the exported telemetry (OTEL_SERVICE_NAME wins); default ctxbudget."""
    metrics_interval_seconds: float = Field(10.0, gt=0)
    """How often metrics are exported."""


class Config(_Model):
    proxy: ProxyConfig = ProxyConfig()
    """The HTTP proxy."""
    agents: AgentsConfig = AgentsConfig()
    """Agent limits and the context budget."""
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    """Memory limits and the memory store."""
    tools: ToolsConfig = ToolsConfig()
    """Tool limits."""
    report: ReportConfig = Field(default_factory=ReportConfig)
    """The report."""
    telemetry: TelemetryConfig = TelemetryConfig()
    """OpenTelemetry traces and metrics (read at start)."""
    database: DatabaseConfig = DatabaseConfig()
    """PostgreSQL for memories, the monitor and the report (read at start)."""

    _origins: dict[str, str] = PrivateAttr(default_factory=dict)
    _sources: dict[str, str] = PrivateAttr(default_factory=dict)

    def origin(self, path: str) -> str:
        """Where the value at dotted `path` came from: `cli`, `env`, `file` or `default`."""
        return self._origins.get(path, "default")

    def source(self, path: str) -> str:
        """Where the value at dotted `path` came from, by name: the file's path, `$` and the
        environment variable, `cli` (a command-line flag) or `default`."""
        return self._sources.get(path, "default")


# -- loading -----------------------------------------------------------------------------


def load_config(
    path: Path | None, *, env: Mapping[str, str], overrides: Mapping[str, Any]
) -> Config:
    """Read, merge and validate the config; raise `ConfigError` listing every problem."""
    data: dict[str, Any] = {}
    origins: dict[str, str] = {}
    sources: dict[str, str] = {}
    problems: list[tuple[str, str]] = []
    """Each problem, and where its value came from (`file`, `env`, `cli`)."""
    if path is not None:
        data = _read_file(path)
        _beside(data, path.parent)
        for key in _leaves(data):
            origins[key] = "file"
            sources[key] = str(path)
    for name, value in sorted(env.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        parts = [to_camel(p.lower()) for p in name[len(ENV_PREFIX) :].split("__")]
        if not all(parts):
            problems.append((f"${name}: not a config path (use CTXBUDGET__SECTION__KEY)", "env"))
            continue
        _set(data, parts, _env_value(value))
        origins[".".join(parts)] = "env"
        sources[".".join(parts)] = "$" + name
    if env.get(DATABASE_URL_ENV):  # the URL may hold a password: an env var of its own
        _set(data, ["database", "url"], env[DATABASE_URL_ENV])
        origins["database.url"] = "env"
        sources["database.url"] = "$" + DATABASE_URL_ENV
    for dotted, value in overrides.items():
        _set(data, dotted.split("."), value)
        origins[dotted] = "cli"
        sources[dotted] = "cli"
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        problems.extend(_describe(err, origins, sources) for err in exc.errors())
    else:
        problems.extend((text, "env") for text in _placeholders(config, env))
    if problems:
        # blame what holds the bad values: the file, the environment, the command line
        blamed = {origin for _, origin in problems}
        where = " and".join(
            text
            for origin, text in (
                ("file", f" in {path}"),
                ("env", " from the environment"),
                ("cli", " from the command line"),
            )
            if origin in blamed and (origin != "file" or path is not None)
        )
        raise ConfigError(
            f"invalid config{where}:\n" + "\n".join(f"- {text}" for text, _ in problems)
        )
    config._origins = origins
    config._sources = sources
    return config


PLACEHOLDER = "replace-me"
"""What every key in `deploy/ctxbudget.env` holds as shipped (`sk-replace-me`,
`replace-me-admin`, ...)."""


def _placeholders(config: Config, env: Mapping[str, str]) -> list[str]:
    """The key variables the config names that still hold the deploy example's placeholder:
    it is public (this repository), so as a proxy, admin or metrics key it would let anyone in
    (the container listens on 0.0.0.0). The value is never shown: a list of proxy keys may
    hold real ones beside it."""
    names = (
        config.proxy.keys_env,
        config.proxy.admin_key_env,
        config.proxy.metrics_key_env,
        config.proxy.upstream.api_key_env,
        config.proxy.anthropic.api_key_env,
    )
    return [
        f"${name} still holds the example's placeholder ({PLACEHOLDER!r}, "
        "deploy/ctxbudget.env): put a key of your own there, or unset it"
        for name in dict.fromkeys(n for n in names if n)
        if PLACEHOLDER in env.get(name, "").lower()
    ]


FILE_PATHS = (("memory", "store", "path"), ("report", "path"))
"""The config's file paths (`FilePath`): relative ones in a config file are beside it."""


def _beside(data: dict[str, Any], folder: Path) -> None:
    """Relative file paths in a config file, made relative to the file's folder: the
    databases a config names are the same files whichever directory a command runs in (they
    were relative to it, so `report` run elsewhere read another file). `~` and absolute paths
    are left as written; a value of the wrong type is left for validation to name."""
    for keys in FILE_PATHS:
        node: Any = data
        for key in keys[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        value = node.get(keys[-1]) if isinstance(node, dict) else None
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            node[keys[-1]] = str(folder / value)


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    try:
        data = _loads(text) if text.strip() else {}
    except ValueError as exc:
        message = str(exc).replace("<string>", str(path))
        raise ConfigError(f"config file {path} is not valid JSONC: {message}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold an object, got {type(data).__name__}")
    return data


def _loads(text: str) -> Any:
    """JSONC: plain JSON through the C parser first (json5's pure-Python parser took ~25 ms
    for a short file, every start and every reload), comments and the rest through json5."""
    try:
        return json.loads(text)
    except ValueError:
        return json5.loads(text)


def _env_value(raw: str) -> Any:
    try:
        value = json5.loads(raw)
    except ValueError:
        return raw
    return value if not isinstance(value, dict | list) else raw


def _set(data: dict[str, Any], parts: list[str], value: Any) -> None:
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def _leaves(data: Mapping[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        out.append(path)
        if isinstance(value, Mapping):
            out.extend(_leaves(value, path + "."))
    return out


_SECRET_HINT = (
    " — secrets never go in the config file: put the key in an environment variable and name "
    "it here with {field}"
)
_SECRET_KEYS = {
    "apiKey": "apiKeyEnv",
    "keys": "keysEnv",
    "adminKey": "adminKeyEnv",
    "metricsKey": "metricsKeyEnv",
}


def _describe(err: Any, origins: Mapping[str, str], sources: Mapping[str, str]) -> tuple[str, str]:
    """What is wrong, for people, and where the bad value came from (`file`, `env`, `cli`)."""
    loc = [str(p) for p in err["loc"]]
    path = ".".join(loc)
    # an unknown key holds the values under it: it came from where they did
    under = [key for key in origins if key == path or key.startswith(path + ".")]
    origin = origins.get(path) or (origins[under[0]] if under else "file")
    text = _problem(err, loc, origin)
    if origin == "env":
        names = sorted({sources[key] for key in under if sources.get(key, "").startswith("$")})
        text += f" (from {', '.join(names)})" if names else ""
    return text, origin


def _problem(err: Any, loc: list[str], origin: str) -> str:
    path = ".".join(loc)
    kind = err["type"]
    given = err.get("input")
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        key = loc[-1]
        if key in _SECRET_KEYS:
            return f"{path}: unknown key" + _SECRET_HINT.format(field=_SECRET_KEYS[key])
        known = {k.lower(): k for k in _known_keys(loc[:-1])}  # variables are upper case
        close = difflib.get_close_matches(key.lower(), known, n=1, cutoff=0.6)
        right = known[close[0]] if close else None
        hint = ""
        if right is not None and origin == "env" and _snake(right) != right.upper():
            # a variable spells camelCase words apart: CONTEXT_BUDGET
            hint = f" — did you mean {right}? (in a variable: {_snake(right)})"
        elif right is not None:
            hint = f" — did you mean {right}?"
        return f"{path}: unknown key{hint}"
    if kind == "value_error":  # a validator's own message says what is wrong and why
        return f"{path}: {ctx.get('error', err['msg'])}"
    shown = f"{given!r}" if not isinstance(given, dict) else "an object"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {
            "greater_than_equal": ">=",
            "greater_than": ">",
            "less_than_equal": "<=",
            "less_than": "<",
        }[kind]
        bound = next(iter(ctx.values()))
        return f"{path} must be {op} {bound}, got {shown}"
    what = {
        "int_type": "an integer",
        "int_parsing": "an integer",
        "int_from_float": "an integer",
        "float_type": "a number",
        "float_parsing": "a number",
        "bool_type": "true or false",
        "bool_parsing": "true or false",
        "string_type": "a string",
        "model_type": "an object",
        "dict_type": "an object",
        "list_type": "a list",
        "string_too_short": "a non-empty string",
        "string_pattern_mismatch": "a litellm model string with a provider prefix "
        "(like anthropic/claude-sonnet-4-5)",
    }.get(kind)
    if kind == "literal_error":
        what = f"one of {ctx.get('expected')}"
    if what is None:
        return f"{path}: {err['msg']}, got {shown}"
    return f"{path} must be {what}, got {shown}"


def _snake(camel: str) -> str:
    return "".join(f"_{c}" if c.isupper() else c.upper() for c in camel)


def _known_keys(loc: list[str]) -> list[str]:
    model: Any = Config
    for part in loc:
        fields = {f.alias or n: f for n, f in model.model_fields.items()}
        field = fields.get(part)
        annotation = getattr(field, "annotation", None)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
        elif part in ("routes",) or model is RouteConfig:
            model = RouteConfig
        else:
            return []
    return [f.alias or n for n, f in model.model_fields.items()]


# -- derived values ----------------------------------------------------------------------


@dataclass(frozen=True)
class EffectiveCaps:
    """The caps in force and where each number came from."""

    caps: Caps
    sources: dict[str, Any]


def effective_caps(config: Config) -> EffectiveCaps:
    """`min(feature limit, contextBudget cap)` per kind, the same whether enabled or not."""
    budget = config.agents.defaults.context_budget
    pairs = {
        "bootstrap": (
            ("agents.defaults.bootstrapMaxChars", config.agents.defaults.bootstrap_max_chars),
            ("agents.defaults.contextBudget.bootstrapMaxChars", budget.bootstrap_max_chars),
        ),
        "memory": (
            ("memory.qmd.limits.maxInjectedChars", config.memory.qmd.limits.max_injected_chars),
            (
                "agents.defaults.contextBudget.memoryMaxInjectedChars",
                budget.memory_max_injected_chars,
            ),
        ),
        "web_fetch": (
            ("tools.web.fetch.maxChars", config.tools.web.fetch.max_chars),
            ("agents.defaults.contextBudget.webFetchMaxChars", budget.web_fetch_max_chars),
        ),
    }
    sources: dict[str, Any] = {}
    values: dict[str, int] = {}
    for kind, ((fkey, fval), (bkey, bval)) in pairs.items():
        key, value = (bkey, bval) if bval <= fval else (fkey, fval)
        values[kind] = value
        sources[kind] = {
            "value": value,
            "source": key,
            "from": config.origin(key),
            "featureLimit": {"key": fkey, "value": fval, "from": config.origin(fkey)},
            "budgetCap": {"key": bkey, "value": bval, "from": config.origin(bkey)},
        }
    # any other tool's output has no feature limit of its own: the budget cap alone
    key = "agents.defaults.contextBudget.toolOutputMaxChars"
    sources["tool_output"] = {
        "value": budget.tool_output_max_chars,
        "source": key,
        "from": config.origin(key),
        "featureLimit": None,
        "budgetCap": {
            "key": key,
            "value": budget.tool_output_max_chars,
            "from": config.origin(key),
        },
    }
    caps = Caps(
        bootstrap_max_chars=values["bootstrap"],
        memory_max_chars=values["memory"],
        web_fetch_max_chars=values["web_fetch"],
        tool_output_max_chars=budget.tool_output_max_chars,
        strategy=budget.clamp_strategy,
    )
    return EffectiveCaps(caps=caps, sources=sources)


def memory_limits(config: Config) -> MemoryLimits:
    """The limits new memories must satisfy."""
    return MemoryLimits(
        max_chars=config.memory.max_chars,
        max_memories=config.memory.max_memories,
        categories=dict(config.memory.categories),
    )


def tool_names(config: Config) -> ToolNames:
    names = config.agents.defaults.context_budget.tool_names
    return ToolNames(
        web_fetch=frozenset(names.web_fetch),
        memory_search=frozenset(names.memory_search),
        memory_get=frozenset(names.memory_get),
        keep_whole=frozenset(names.keep_whole),
    )


@functools.lru_cache(maxsize=256)
def is_loopback(host: str) -> bool:
    """Whether a listen address or host name is this machine only: an IP literal in
    127.0.0.0/8 or ::1, `localhost`, or a `*.localhost` name (browsers resolve those to
    loopback themselves). `127.attacker.example` is a DNS name, not an address."""
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _secret(env: Mapping[str, str], name: str | None) -> str | None:
    value = env.get(name, "").strip() if name else ""
    return value or None


def upstream_api_key(config: Config, env: Mapping[str, str]) -> str | None:
    """The upstream key from the environment variable the config names, if set."""
    return _secret(env, config.proxy.upstream.api_key_env)


def anthropic_api_key(config: Config, env: Mapping[str, str]) -> str | None:
    """The Anthropic key from the environment variable the config names, if set."""
    return _secret(env, config.proxy.anthropic.api_key_env)


_OWNER = re.compile(r"[A-Za-z0-9_.@-]{1,64}")


def proxy_keys(config: Config, env: Mapping[str, str]) -> dict[str, str]:
    """Key → owner for the keys clients must present; empty when access is open.

    Entries are comma-separated, each `owner=key` or a bare key (owner `key-<8 hex of its
    SHA-256>`, so memories can be told apart without naming the secret).
    """
    raw = _secret(env, config.proxy.keys_env) or ""
    keys: dict[str, str] = {}
    for entry in (e.strip() for e in raw.split(",")):
        if not entry:
            continue
        owner, sep, key = entry.partition("=")
        # `owner=key` only when the key is more than base64 padding: a bare base64 key
        # (`c2VjcmV0LWtleQ==`) must stay whole, not become the key "=".
        if sep and _OWNER.fullmatch(owner.strip()) and key.strip().strip("="):
            keys[key.strip()] = owner.strip()
        else:
            keys[entry] = "key-" + hashlib.sha256(entry.encode()).hexdigest()[:8]
    return keys


def admin_key(config: Config, env: Mapping[str, str]) -> str | None:
    """The admin key, if set."""
    return _secret(env, config.proxy.admin_key_env)


def metrics_key(config: Config, env: Mapping[str, str]) -> str | None:
    """The key that may read `/metrics`, if set."""
    return _secret(env, config.proxy.metrics_key_env)


# -- watching ----------------------------------------------------------------------------


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class ConfigSource:
    """The config in force, re-read when its file changes.

    `get()` runs on every request: one `stat()` (a few µs). A broken edit keeps the last good
    config; the problem is kept in `error` for the report and logged once per broken version.
    """

    def __init__(
        self, path: Path | None, env: Mapping[str, str], overrides: Mapping[str, Any]
    ) -> None:
        self.path = path
        self._env = env
        self._overrides = dict(overrides)
        self._stamp = _stamp(path) if path else None
        self._config = load_config(path, env=env, overrides=self._overrides)
        self.error: str | None = None
        self.loaded_at = time.time()
        self.generation = 1

    def get(self) -> Config:
        """The current config, reloaded first if the file changed."""
        if self.path is None:
            return self._config
        stamp = _stamp(self.path)
        if stamp == self._stamp:
            return self._config
        self._stamp = stamp
        if stamp is None:
            self._fail(f"config file {self.path} is gone; keeping the last good config")
            return self._config
        try:
            config = load_config(self.path, env=self._env, overrides=self._overrides)
        except ConfigError as exc:
            self._fail(exc.message)
            return self._config
        self._config = config
        self.error = None
        self.loaded_at = time.time()
        self.generation += 1
        log.info("config reloaded from %s", self.path)
        return config

    def _fail(self, message: str) -> None:
        self.error = message
        log.warning("%s (keeping the last good config)", message)
