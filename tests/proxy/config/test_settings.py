"""Settings: every value the request path reads, derived once per config version."""

from __future__ import annotations

from pathlib import Path

from ctxbudget.proxy.config.schema import ConfigSource, load_config
from ctxbudget.proxy.config.settings import settings_for


def test_memory_cap_is_the_effective_cap_with_the_budget_on_else_the_feature_limit(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.jsonc"
    path.write_text(
        '{"agents": {"defaults": {"contextBudget": {"memoryMaxInjectedChars": 1200}}},'
        ' "memory": {"qmd": {"limits": {"maxInjectedChars": 3000}}}}'
    )
    settings = settings_for(load_config(path, env={}, overrides={}), {})
    assert settings.memory_max_chars(True) == 1200
    assert settings.memory_max_chars(False) == 3000


def test_recall_config_mirrors_memory_config(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonc"
    path.write_text(
        '{"memory": {"inject": {"budget": "lean", "placement": "system"},'
        ' "budgets": {"agents": {"ops": "role-architect"}, "defaultAgent": "boss",'
        ' "contextWindows": {"my-model": 32000}}}}'
    )
    settings = settings_for(load_config(path, env={}, overrides={}), {})
    recall = settings.recall
    assert (recall.profile, recall.placement, recall.default_agent) == ("lean", "system", "boss")
    assert recall.agents == {"ops": "role-architect"}
    assert recall.budget_profiles["role-architect"].tokens == 75_000
    assert settings.context_windows == {"my-model": 32000}


def test_secrets_come_from_the_environment_and_never_appear_in_the_report(tmp_path: Path) -> None:
    env = {
        "OPENAI_API_KEY": "sk-up",
        "CTXBUDGET_PROXY_KEYS": "a=pk-9f3e",
        "CTXBUDGET_ADMIN_KEY": "ak-77c1",
    }
    path = tmp_path / "c.jsonc"
    path.write_text("{}")
    source = ConfigSource(path, env, {})
    settings = settings_for(source.get(), env)
    assert settings.upstream_api_key == "sk-up"
    assert settings.proxy_keys == {"pk-9f3e": "a"}
    assert settings.admin_key == "ak-77c1"
    shown = repr(settings) + repr(settings.report_section(source))
    for secret in ("sk-up", "pk-9f3e", "ak-77c1"):
        assert secret not in shown


def test_routes_and_encodings(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonc"
    path.write_text(
        '{"proxy": {"routes": {"claude": {"model": "anthropic/claude-x"}},'
        ' "upstream": {"baseUrl": "http://up/v1/"}}}'
    )
    settings = settings_for(load_config(path, env={}, overrides={}), {})
    assert settings.route_for("claude") is not None
    assert settings.route_for("gpt-4o") is None and settings.route_for(None) is None
    assert settings.upstream_url("/chat/completions") == "http://up/v1/chat/completions"
    assert settings.encoding_for("gpt-4") == "cl100k_base"
    assert settings.encoding_for("unknown-model") == "o200k_base"
