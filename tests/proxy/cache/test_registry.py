"""Every cache kept between requests is in `proxy/cache/registry.py`, and the table in
`docs/architecture.md` is written from it (issue 34, issue 35 item 6)."""

from __future__ import annotations

import re
from pathlib import Path

from ctxbudget.proxy.cache.registry import CACHES, registered, table

ROOT = Path(__file__).resolve().parents[3]
_MADE = re.compile(
    r"weighed\(|Generations\(|ByIdentity\(|ByValue\(|OfObjects\(|LRUCache\(|lru_cache|functools\.cache\b"
    r"|^_[A-Z_]+: dict\["
)
_NAME = re.compile(r"^\s*(?:self\.)?(\w+)\s*(?::[^=]*)?=")
_DEF = re.compile(r"^\s*def (\w+)")


def _caches_in_code() -> set[str]:
    found = set()
    for package in ("caps", "memory", "proxy"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "_kept.py":  # where the cache types are defined
                continue
            lines = path.read_text().splitlines()
            for i, line in enumerate(lines):
                if not _MADE.search(line) or line.lstrip().startswith(("#", ">>>", "from ")):
                    continue
                if line.lstrip().startswith("@"):  # a cached function: named by its def
                    name = next(m.group(1) for m in map(_DEF.match, lines[i:]) if m)
                else:
                    match = _NAME.match(line)
                    assert match, f"{path}:{i + 1}: a cache with no name: {line.strip()}"
                    name = match.group(1)
                found.add(f"{path.relative_to(ROOT)}:{name}")
    return found


def test_every_cache_in_the_code_is_registered() -> None:
    in_code = _caches_in_code()
    assert in_code - registered() == set(), "register these in proxy/cache/registry.py"
    for where in registered() - in_code:  # a plain dict the pattern does not find
        path, name = where.split(":")
        assert re.search(rf"\b{name}\b", (ROOT / path).read_text()), f"{where}: not in the code"


def test_every_cache_found_by_a_value_names_its_owner_or_says_why_not() -> None:
    for cache in CACHES:
        assert (
            "owner" in cache.key
            or "identity" in cache.invariant
            or (
                "no owner" in cache.invariant
                or cache.key.startswith(("none", "response id", "owner"))
            )
        ), cache.where


def test_the_architecture_doc_holds_the_registry_table() -> None:
    assert table() in (ROOT / "docs" / "architecture.md").read_text()


def test_the_worker_past_its_bound_empties_every_registered_module_level_kept_cache() -> None:
    """`clear_kept` (the offload worker past `WORKER_RSS`) finds the proxy's module-level
    caches of the `ctxbudget.caps._kept` types through this registry: with `caps` keeping
    none, nothing else lists them."""
    import ctxbudget.proxy.cache.blocks
    import ctxbudget.proxy.cache.tools
    from ctxbudget.caps._kept import ByIdentity, Generations
    from ctxbudget.proxy.cache.registry import clear_kept

    kept = []
    for cache in CACHES:
        path, name = cache.where.split(":")
        module = __import__("ctxbudget." + path.removesuffix(".py").replace("/", "."))
        for part in path.removesuffix(".py").split("/"):
            module = getattr(module, part)
        found = getattr(getattr(module, name, None), "kept", getattr(module, name, None))
        if isinstance(found, Generations | ByIdentity):
            kept.append(found)
    assert ctxbudget.proxy.cache.blocks._SERIAL_KEPT in kept
    assert ctxbudget.proxy.cache.tools._inline.kept in kept  # type: ignore[attr-defined]
    item = {"text": "x" * 4096}
    ctxbudget.proxy.cache.blocks._SERIAL_KEPT.get(lambda o: b"y" * 4096, item)
    assert ctxbudget.proxy.cache.blocks._SERIAL_KEPT.weight > 0
    clear_kept()
    assert all(k.weight == 0 for k in kept)
