"""Context windows and prices from litellm's offline model map, read as plain JSON.

litellm ships `model_prices_and_context_window_backup.json`; reading that file (once, ~25 ms)
gives the windows without importing litellm (~5 s, ~165 MB).
"""

from __future__ import annotations

import functools
import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAP_FILE = "model_prices_and_context_window_backup.json"


@functools.lru_cache(maxsize=1)
def _model_map() -> dict[str, Any]:
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(next(iter(spec.submodule_search_locations))) / MAP_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def context_window(model: str | None, overrides: Mapping[str, int]) -> int | None:
    """Input tokens `model` accepts: config first, then litellm's map; None if unknown."""
    if not model:
        return None
    if model in overrides:
        return overrides[model]
    known = _model_map()
    for name in (model, model.rsplit("/", 1)[-1]):
        entry = known.get(name)
        if isinstance(entry, dict):
            window = entry.get("max_input_tokens") or entry.get("max_tokens")
            if isinstance(window, int) and window > 0:
                return window
    return None


@functools.lru_cache(maxsize=512)
def input_price(model: str | None) -> float | None:
    """USD per input token for `model` from litellm's map; None if unknown.

    `model` may carry a provider prefix (`openai/gpt-4o`): the full name is tried first.
    """
    if not model:
        return None
    known = _model_map()
    for name in (model, model.rsplit("/", 1)[-1]):
        entry = known.get(name)
        if isinstance(entry, dict):
            price = entry.get("input_cost_per_token")
            if isinstance(price, int | float) and price >= 0:
                return float(price)
    return None


@dataclass(frozen=True)
class Prices:
    """USD per token of each class a provider bills, from litellm's map."""

    input: float
    output: float
    cache_read: float
    """Cached input read; the input price when the map has none (billed as input)."""
    cache_write: float
    """Cached input written for 5 minutes (Anthropic's default lifetime: 1.25× input); the
    input price when the map has none (no write premium)."""
    cache_write_1h: float | None = None
    """Cached input written for 1 hour (`cache_control.ttl: "1h"`): the map's
    `cache_creation_input_token_cost_above_1hr`; None: Anthropic's rule, 2× input
    (`proxy.report.billing.write_price` reads it)."""


@functools.lru_cache(maxsize=512)
def prices(model: str | None) -> Prices | None:
    """Every price of `model` from litellm's map; None when its input price is unknown."""
    if not model:
        return None
    known = _model_map()
    for name in (model, model.rsplit("/", 1)[-1]):
        entry = known.get(name)
        if not isinstance(entry, dict):
            continue
        price = _price(entry, "input_cost_per_token")
        if price is None:
            continue
        return Prices(
            input=price,
            output=_price(entry, "output_cost_per_token") or 0.0,
            cache_read=_or(_price(entry, "cache_read_input_token_cost"), price),
            cache_write=_or(_price(entry, "cache_creation_input_token_cost"), price),
            cache_write_1h=_price(entry, "cache_creation_input_token_cost_above_1hr"),
        )
    return None


def _price(entry: Mapping[str, Any], key: str) -> float | None:
    value = entry.get(key)
    return float(value) if isinstance(value, int | float) and value >= 0 else None


def _or(value: float | None, default: float) -> float:
    return default if value is None else value
