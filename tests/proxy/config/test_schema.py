from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from ctxbudget.proxy.config.schema import (
    BudgetProfileConfig,
    Config,
    ConfigSource,
    RouteConfig,
    effective_caps,
    load_config,
    proxy_keys,
    tool_names,
    upstream_api_key,
)
from ctxbudget.proxy.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "config.example.jsonc"


def _write(path: Path, data: dict[str, Any] | str) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        out.append(prefix + key)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out.extend(_fields(annotation, f"{prefix}{key}."))
    return out


def _documented(lines: list[str], i: int) -> bool:
    if "//" in lines[i]:
        return True
    for line in reversed(lines[:i]):
        stripped = line.strip()
        if stripped.startswith("//"):
            return True
        if not re.fullmatch(r'"\w+": [^{]*,?', stripped):
            return False
    return False


def test_example_config_loads_and_documents_every_field() -> None:
    config = load_config(EXAMPLE, env={}, overrides={})
    assert config.model_dump() == Config().model_dump(), "the example shows the defaults"
    text = EXAMPLE.read_text()
    lines = text.splitlines()
    nested = [f"proxy.routes.*.{k}" for k in _fields(RouteConfig)] + [
        f"memory.budgets.profiles.*.{k}" for k in _fields(BudgetProfileConfig)
    ]
    for dotted in _fields(Config) + nested:
        key = dotted.rsplit(".", 1)[-1]
        at = [i for i, line in enumerate(lines) if f'"{key}"' in line]
        assert at, f"{dotted} is not in config.example.jsonc"
        # documented: an inline comment, or a comment directly above it (sibling scalar keys
        # may share one comment block)
        assert any(_documented(lines, i) for i in at), f"{dotted} has no comment"
    for name, field in Config.model_fields.items():
        assert field.description, f"{name} has no docstring"


def test_unknown_key_names_its_full_path_and_the_closest_key(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "c.jsonc",
        {"agents": {"defaults": {"contextBudget": {"webFetchMaxChar": 100}}}},
    )
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "- agents.defaults.contextBudget.webFetchMaxChar: unknown key — "
            "did you mean webFetchMaxChars?"
        ),
    ):
        load_config(path, env={}, overrides={})


def test_a_misspelt_budget_profile_is_named_with_the_closest_one(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "c.jsonc",
        {"memory": {"budgets": {"agents": {"coder": "role-architcet"}}}},
    )
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "- memory.budgets: agents.coder names budget profile 'role-architcet', which "
            "memory.budgets.profiles does not define (it has role-architect, role-coordinator, "
            "specialist-broad, specialist-narrow) — did you mean role-architect?"
        ),
    ):
        load_config(path, env={}, overrides={})
    path = _write(tmp_path / "d.jsonc", {"memory": {"budgets": {"defaultProfile": "tiny"}}})
    with pytest.raises(ConfigError, match=re.escape("defaultProfile names budget profile 'tiny'")):
        load_config(path, env={}, overrides={})


def test_secrets_are_refused_in_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonc", {"proxy": {"upstream": {"apiKey": "sk-123"}}})
    with pytest.raises(ConfigError, match="put the key in an environment variable") as info:
        load_config(path, env={}, overrides={})
    assert "sk-123" not in info.value.message


def test_wrong_types_and_ranges_say_key_value_and_allowed(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "c.jsonc",
        {
            "proxy": {"port": "4141", "logLevel": "loud"},
            "agents": {"defaults": {"contextBudget": {"webFetchMaxChars": -5, "enabled": 1}}},
        },
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, env={}, overrides={})
    message = info.value.message
    assert "- proxy.port must be an integer, got '4141'" in message
    assert "- proxy.logLevel must be one of 'debug', 'info', 'warning' or 'error', got 'loud'" in (
        message
    )
    assert "- agents.defaults.contextBudget.webFetchMaxChars must be >= 0, got -5" in message
    assert "- agents.defaults.contextBudget.enabled must be true or false, got 1" in message


def test_bad_jsonc_gives_file_line_and_column(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonc", '{\n  // a comment\n  "proxy": {"port": },\n}')
    with pytest.raises(ConfigError, match=re.escape(f'{path}:3 Unexpected "}}" at column')):
        load_config(path, env={}, overrides={})


def test_comments_and_trailing_commas_are_fine(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonc", '{\n  // c\n  "proxy": {"port": 5000,},\n}')
    assert load_config(path, env={}, overrides={}).proxy.port == 5000


def test_precedence_cli_env_file_default(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonc", {"proxy": {"port": 1111, "host": "0.0.0.0"}})
    env = {"CTXBUDGET__PROXY__PORT": "2222", "CTXBUDGET__PROXY__LOG_LEVEL": "debug"}
    config = load_config(path, env=env, overrides={"proxy.port": 3333})
    assert config.proxy.port == 3333
    assert config.origin("proxy.port") == "cli"
    assert config.proxy.log_level == "debug" and config.origin("proxy.logLevel") == "env"
    assert config.proxy.host == "0.0.0.0" and config.origin("proxy.host") == "file"
    assert config.proxy.max_body_bytes == 32 * 1024 * 1024
    assert config.origin("proxy.maxBodyBytes") == "default"
    assert load_config(path, env=env, overrides={}).proxy.port == 2222


def test_env_values_are_typed_and_unknown_env_keys_name_the_variable() -> None:
    env = {"CTXBUDGET__AGENTS__DEFAULTS__CONTEXT_BUDGET__ENABLED": "true"}
    assert load_config(None, env=env, overrides={}).agents.defaults.context_budget.enabled
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "proxy.prot: unknown key — did you mean port? (from $CTXBUDGET__PROXY__PROT)"
        ),
    ):
        load_config(None, env={"CTXBUDGET__PROXY__PROT": "1"}, overrides={})


def test_a_bad_variable_is_blamed_on_the_environment_not_the_file(tmp_path: Path) -> None:
    """Issue 23: `CTXBUDGET__…` mistakes were reported as "invalid config in <file>", and a
    misspelt section in a variable did not name the variable at all."""
    path = _write(tmp_path / "ctxbudget.jsonc", {"proxy": {"port": 5000}})
    wrong = "CTXBUDGET__AGENTS__DEFAULTS__CONTEXTBUDGET__BOOTSTRAPMAXCHARS"
    with pytest.raises(ConfigError) as raised:
        load_config(path, env={wrong: "4000"}, overrides={})
    assert raised.value.message == (
        "invalid config from the environment:\n- agents.defaults.contextbudget: unknown key — "
        f"did you mean contextBudget? (in a variable: CONTEXT_BUDGET) (from ${wrong})"
    )
    enabled = "CTXBUDGET__AGENTS__DEFAULTS__CONTEXT_BUDGET__ENABLED"
    with pytest.raises(ConfigError) as raised:
        load_config(path, env={enabled: "maybe"}, overrides={})
    assert raised.value.message.startswith("invalid config from the environment:\n")
    # both at fault: both named
    broken = _write(tmp_path / "broken.jsonc", {"proxy": {"port": "x"}})
    with pytest.raises(ConfigError) as raised:
        load_config(broken, env={enabled: "maybe"}, overrides={})
    assert raised.value.message.startswith(
        f"invalid config in {broken} and from the environment:\n- "
    )


def test_secrets_come_from_the_environment() -> None:
    config = load_config(None, env={}, overrides={})
    assert upstream_api_key(config, {}) is None
    assert upstream_api_key(config, {"OPENAI_API_KEY": "sk-1"}) == "sk-1"
    keys = proxy_keys(config, {"CTXBUDGET_PROXY_KEYS": " alice=pk-a, pk-b ,,"})
    assert keys == {"pk-a": "alice", "pk-b": "key-" + hashlib.sha256(b"pk-b").hexdigest()[:8]}
    assert proxy_keys(config, {}) == {}


def test_effective_caps_take_the_smaller_limit_and_say_where_from(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "c.jsonc",
        {"tools": {"web": {"fetch": {"maxChars": 3000}}}, "agents": {"defaults": {}}},
    )
    effective = effective_caps(load_config(path, env={}, overrides={}))
    assert effective.caps.web_fetch_max_chars == 3000
    assert effective.caps.bootstrap_max_chars == 8000
    assert effective.sources["web_fetch"]["source"] == "tools.web.fetch.maxChars"
    assert effective.sources["web_fetch"]["from"] == "file"
    assert effective.sources["bootstrap"]["from"] == "default"
    names = tool_names(load_config(None, env={}, overrides={}))
    assert names.web_fetch == {"web_fetch"}


def test_routes_need_a_provider_prefix(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonc", {"proxy": {"routes": {"c": {"model": "claude"}}}})
    with pytest.raises(ConfigError, match="proxy.routes.c.model must be a litellm model string"):
        load_config(path, env={}, overrides={})


def test_watcher_reloads_keeps_last_good_and_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _write(tmp_path / "c.jsonc", {"proxy": {"port": 1000}})
    source = ConfigSource(path, {}, {})
    assert source.get().proxy.port == 1000 and source.generation == 1

    _write(path, {"proxy": {"port": 2000}})
    os.utime(path, ns=(10**9, 10**9))
    assert source.get().proxy.port == 2000 and source.generation == 2

    caplog.set_level(logging.INFO, logger="ctxbudget.config")
    _write(path, '{"proxy": {"port": ')
    os.utime(path, ns=(2 * 10**9, 2 * 10**9))
    assert source.get().proxy.port == 2000
    assert source.error is not None and str(path) in source.error
    source.get()
    assert sum("keeping the last good config" in r.message for r in caplog.records) == 1

    _write(path, {"proxy": {"port": 3000}})
    os.utime(path, ns=(3 * 10**9, 3 * 10**9))
    assert source.get().proxy.port == 3000 and source.error is None

    path.unlink()
    assert source.get().proxy.port == 3000
    assert source.error is not None and "is gone" in source.error


def test_a_broken_config_at_start_raises(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonc", "[]")
    with pytest.raises(ConfigError, match="must hold an object, got list"):
        ConfigSource(path, {}, {})


def test_a_base_url_without_a_scheme_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonc", {"proxy": {"upstream": {"baseUrl": "127.0.0.1:18555"}}})
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "- proxy.upstream.baseUrl: must start with http:// or https://, got "
            "'127.0.0.1:18555': write 'http://127.0.0.1:18555'"
        ),
    ):
        load_config(path, env={}, overrides={})


def test_source_names_the_file_the_variable_or_cli(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonc", {"proxy": {"host": "0.0.0.0"}})
    config = load_config(
        path, env={"CTXBUDGET__PROXY__LOG_LEVEL": "debug"}, overrides={"proxy.port": 1}
    )
    assert config.source("proxy.host") == str(path)
    assert config.source("proxy.logLevel") == "$CTXBUDGET__PROXY__LOG_LEVEL"
    assert config.source("proxy.port") == "cli"
    assert config.source("proxy.maxBodyBytes") == "default"


def test_default_files_are_in_the_home_of_the_moment_of_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    config = load_config(None, env={}, overrides={})
    assert config.memory.store.path == tmp_path / ".ctxbudget" / "memory.db"
    assert config.report.path == tmp_path / ".ctxbudget" / "report.db"


def _example_env() -> dict[str, str]:
    """deploy/ctxbudget.env as shipped: the keys' placeholders."""
    lines = (ROOT / "deploy" / "ctxbudget.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


@pytest.mark.parametrize(
    "name",
    ["CTXBUDGET_ADMIN_KEY", "CTXBUDGET_PROXY_KEYS", "CTXBUDGET_METRICS_KEY", "OPENAI_API_KEY"],
)
def test_a_key_left_as_the_deploy_examples_placeholder_is_refused(name: str) -> None:
    # Found by the round-36 attack: deploy/ctxbudget.env ships `replace-me` keys, and the
    # container listens on 0.0.0.0; a line left as shipped made `replace-me-admin` (in this
    # public repository) an admin key that reads every owner's report and manages memories.
    example = _example_env()
    env = {name: example[name]}
    if name != "CTXBUDGET_PROXY_KEYS":  # a real proxy key beside it: only one is left
        env["CTXBUDGET_PROXY_KEYS"] = "alice=pk-9f8e7d6c5b4a"
    with pytest.raises(ConfigError) as raised:
        load_config(ROOT / "deploy" / "container.jsonc", env=env, overrides={})
    assert f"${name}" in str(raised.value)
    assert example[name] not in str(raised.value)  # a key's value is never shown
    assert "pk-9f8e7d6c5b4a" not in str(raised.value)
