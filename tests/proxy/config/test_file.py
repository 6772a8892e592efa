from __future__ import annotations

import doctest
import json
import re
from pathlib import Path

import pytest

from ctxbudget.proxy.config import file as configfile
from ctxbudget.proxy.config.file import (
    ConfigLocation,
    effective_values,
    find_config,
    render_jsonc,
    snippet,
    starter_text,
)
from ctxbudget.proxy.config.schema import Config, load_config
from ctxbudget.proxy.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")
    return path


def test_find_config_takes_the_first_of_flag_env_jsonc_json_home(tmp_path: Path) -> None:
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    looked = (cwd / "ctxbudget.jsonc", cwd / "ctxbudget.json", home / ".ctxbudget/config.jsonc")
    assert find_config(None, {}, cwd=cwd, home=home) == ConfigLocation(
        path=None, via="defaults", looked=looked
    )
    in_home = _touch(looked[2])
    assert find_config(None, {}, cwd=cwd, home=home).path == in_home
    plain = _touch(looked[1])
    assert find_config(None, {}, cwd=cwd, home=home).path == plain
    jsonc = _touch(looked[0])
    found = find_config(None, {}, cwd=cwd, home=home)
    assert (found.path, found.ignored) == (jsonc, plain)
    named = _touch(tmp_path / "named.jsonc")
    env = {"CTXBUDGET_CONFIG": str(named)}
    assert find_config(None, env, cwd=cwd, home=home).path == named
    assert find_config(str(in_home), env, cwd=cwd, home=home).path == in_home
    assert find_config("../named.jsonc", {}, cwd=cwd, home=home).path == named
    assert find_config(None, {"CTXBUDGET_CONFIG": ""}, cwd=cwd, home=home).path == jsonc
    with pytest.raises(
        ConfigError,
        match=re.escape(f"config file {cwd / 'nope.jsonc'} (from --config) not found"),
    ):
        find_config("nope.jsonc", env, cwd=cwd, home=home)


def test_the_starter_is_the_documented_example() -> None:
    # config.example.jsonc is shipped in the package (proxy/config.example.jsonc links to it)
    assert starter_text() == (ROOT / "config.example.jsonc").read_text(encoding="utf-8")


def test_the_effective_config_renders_as_jsonc_that_loads_back(tmp_path: Path) -> None:
    source = tmp_path / "c.jsonc"
    source.write_text(
        json.dumps(
            {
                "proxy": {"routes": {"claude-3.5": {"model": "anthropic/claude-3-5-sonnet"}}},
                "memory": {"categories": {}, "budgets": {"contextWindows": {"gpt-4.1": 1000}}},
            }
        )
    )
    config = load_config(source, env={"CTXBUDGET__PROXY__PORT": "5"}, overrides={})
    values = effective_values(config)
    by_path = {v.path: v for v in values}
    assert by_path["proxy.port"].source == "$CTXBUDGET__PROXY__PORT"
    assert by_path["memory.categories"].value == {}  # an empty map is one value
    assert by_path["memory.budgets.contextWindows.gpt-4.1"].keys[-1] == "gpt-4.1"
    assert by_path["proxy.routes.claude-3.5.apiBase"].source == "default"
    assert by_path["proxy.routes.claude-3.5.model"].source == str(source)
    shown = tmp_path / "shown.jsonc"
    shown.write_text(render_jsonc(values))
    assert load_config(shown, env={}, overrides={}).model_dump() == config.model_dump()
    assert len(values) > len(Config.model_fields)


def test_snippet_keeps_objects_on_one_line_where_they_fit() -> None:
    assert doctest.testmod(configfile).failed == 0
    profiles = {
        name: {"tokens": 20000, "maxTokens": 50000, "scopeWeights": {"global": 0.2}}
        for name in ("narrow", "architect")
    }
    text = snippet({"memory.budgets.profiles": profiles})
    assert json.loads(text) == {"memory": {"budgets": {"profiles": profiles}}}
    assert text.splitlines()[4] == (
        '        "narrow": {"tokens": 20000, "maxTokens": 50000, "scopeWeights": {"global": 0.2}},'
    )
    wide = {"x" * 200: 1}
    assert snippet({"a": wide}) == '{\n  "a": {\n    "' + "x" * 200 + '": 1\n  }\n}'
    # (a trailing comma may go one past the width)
    assert max(len(line) for line in text.splitlines()) <= configfile.SNIPPET_WIDTH + 1
