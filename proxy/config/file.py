"""The config file as people handle it: which one is in force, a starter, what it holds.

Which file, first found wins (`find_config`):

1. `--config PATH`
2. `$CTXBUDGET_CONFIG`
3. `./ctxbudget.jsonc`, then `./ctxbudget.json`
4. `~/.ctxbudget/config.jsonc`
5. none: the built-in defaults.

A path given by 1 or 2 must exist. Every CLI command says on stderr which file it used
(`ConfigLocation.describe`), so a command run from another directory can no longer read
another store than the proxy without saying so.

`starter_text` is `config.example.jsonc` (every field, commented, at its default), shipped in
the package, for `ctxbudget config init`. `effective_values` lists every value in force and
where it came from, for `ctxbudget config show`; config values hold only the *names* of the
environment variables with secrets, and credentials in URLs are masked.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from ctxbudget.proxy.config.schema import Config
from ctxbudget.proxy.errors import ConfigError
from ctxbudget.proxy.urls import redact

ENV_CONFIG = "CTXBUDGET_CONFIG"
LOCAL_FILES = ("ctxbudget.jsonc", "ctxbudget.json")
"""Looked for in the current directory, in this order."""
STARTER = "config.example.jsonc"
"""The starter's name in the `proxy` package (the repository's `config.example.jsonc`)."""

Via = Literal["--config", "$CTXBUDGET_CONFIG", "current directory", "home", "defaults"]


def absolute(given: str, cwd: Path) -> Path:
    """`given` (`~` expanded) as an absolute path, relative ones from `cwd`; `..` folded away
    as the shell would, symlinks left alone."""
    return Path(os.path.normpath(cwd / Path(given).expanduser()))


def home_config(home: Path) -> Path:
    """The per-user config file, found from any directory: `~/.ctxbudget/config.jsonc`."""
    return home / ".ctxbudget" / "config.jsonc"


@dataclass(frozen=True, kw_only=True)
class ConfigLocation:
    """Which config file a command reads, and how it was found."""

    path: Path | None
    """The file (absolute), or None for the built-in defaults."""
    via: Via
    """What named it."""
    looked: tuple[Path, ...] = ()
    """The places searched, in order, when neither `--config` nor `$CTXBUDGET_CONFIG` was given."""
    ignored: Path | None = None
    """`./ctxbudget.json` when `./ctxbudget.jsonc` is there too (and so wins)."""

    def describe(self) -> str:
        """The line every command prints on stderr after `ctxbudget: `."""
        if self.path is None:
            places = ", ".join(str(p) for p in self.looked)
            return f"using built-in defaults (no config file found: looked in {places})"
        notes = []
        if self.via == "$CTXBUDGET_CONFIG":
            notes.append("from $CTXBUDGET_CONFIG")
        if self.ignored is not None:
            notes.append(f"{self.ignored} is ignored: {self.path.name} comes first")
        return f"using config {self.path}" + (f" ({'; '.join(notes)})" if notes else "")


def find_config(
    cli_path: str | None, env: Mapping[str, str], *, cwd: Path, home: Path
) -> ConfigLocation:
    """The config file in force (see the module docstring); `ConfigError` when `--config` or
    `$CTXBUDGET_CONFIG` names a file that is not there."""
    named: tuple[tuple[Via, str | None], ...] = (
        ("--config", cli_path),
        ("$CTXBUDGET_CONFIG", env.get(ENV_CONFIG)),
    )
    for via, given in named:
        if given:
            path = absolute(given, cwd)
            if not path.is_file():
                what = "is not a file" if path.exists() else "not found"
                raise ConfigError(f"config file {path} (from {via}) {what}")
            return ConfigLocation(path=path, via=via)
    local = [cwd / name for name in LOCAL_FILES]
    looked = (*local, home_config(home))
    found = [p for p in looked if p.is_file()]
    if not found:
        return ConfigLocation(path=None, via="defaults", looked=looked)
    path = found[0]
    return ConfigLocation(
        path=path,
        via="home" if path == looked[-1] else "current directory",
        looked=looked,
        ignored=local[1] if path == local[0] and local[1] in found else None,
    )


def starter_text() -> str:
    """The commented starter config: `config.example.jsonc`, every field at its default."""
    return (resources.files("ctxbudget.proxy") / STARTER).read_text(encoding="utf-8")


@dataclass(frozen=True)
class Setting:
    """One value in force and where it came from."""

    keys: tuple[str, ...]
    """Its place in the config, key by key (a map's keys may hold dots: `gpt-4.1`)."""
    value: Any
    """As JSON would hold it."""
    source: str
    """`Config.source`: the file's path, `$VARIABLE`, `cli` or `default`."""

    @property
    def path(self) -> str:
        return ".".join(self.keys)


def effective_values(config: Config) -> list[Setting]:
    """Every value in force, in schema order. Maps (`memory.categories`, `proxy.routes`, …)
    are listed key by key; an empty one is one value."""
    out: list[Setting] = []

    def walk(node: Mapping[str, Any], keys: tuple[str, ...]) -> None:
        for key, value in node.items():
            here = (*keys, key)
            if isinstance(value, dict) and value:
                walk(value, here)
            else:
                out.append(Setting(here, _masked(value), config.source(".".join(here))))

    walk(config.model_dump(mode="json", by_alias=True), ())
    return out


def _masked(value: Any) -> Any:
    # Values are never secrets by design, but a URL may still carry `user:key@`.
    return redact(value) if isinstance(value, str) else value


def nest(values: list[Setting]) -> dict[str, Any]:
    """`effective_values` back into one nested object (the `config` of `config show --json`)."""
    root: dict[str, Any] = {}
    for setting in values:
        node = root
        for key in setting.keys[:-1]:
            node = node.setdefault(key, {})
        node[setting.keys[-1]] = setting.value
    return root


def render_jsonc(
    values: list[Setting], *, comment: Callable[[Setting], str] = lambda s: s.source
) -> str:
    """The effective config as JSONC, each value followed by a comment saying where it came
    from (`comment`). It loads back as the same config (credentials in URLs aside)."""
    lines: list[str] = []
    opened: list[str] = []

    def indent() -> str:
        return "  " * (len(opened) + 1)

    for setting in values:
        *parents, last = setting.keys
        common = 0
        while common < min(len(opened), len(parents)) and opened[common] == parents[common]:
            common += 1
        while len(opened) > common:
            opened.pop()
            lines.append(indent() + "},")
        for key in parents[common:]:
            lines.append(indent() + f"{json.dumps(key)}: {{")
            opened.append(key)
        shown = json.dumps(setting.value, ensure_ascii=False)
        lines.append(indent() + f"{json.dumps(last)}: {shown},  // {comment(setting)}")
    while opened:
        opened.pop()
        lines.append(indent() + "},")
    return "{\n" + "\n".join(lines) + "\n}\n"


SNIPPET_WIDTH = 96


def snippet(values: Mapping[str, Any]) -> str:
    """Config values (dotted path → value) as one JSON object to paste into the config file,
    objects kept on one line where they fit.

    >>> print(snippet({"memory.budgets.agents": {"main": "specialist-broad"}}))
    {"memory": {"budgets": {"agents": {"main": "specialist-broad"}}}}
    """
    root: dict[str, Any] = {}
    for path, value in values.items():
        node = root
        *parents, last = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return _compact(root, indent=0, column=0)


def _compact(value: Any, *, indent: int, column: int) -> str:
    flat = json.dumps(value, ensure_ascii=False)
    if not isinstance(value, dict) or not value or column + len(flat) <= SNIPPET_WIDTH:
        return flat
    pad = " " * (indent + 2)
    items = []
    for key, item in value.items():
        head = f"{pad}{json.dumps(key, ensure_ascii=False)}: "
        items.append(head + _compact(item, indent=indent + 2, column=len(head)))
    return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
