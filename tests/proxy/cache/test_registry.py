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


# -- one bound on the process's memory (issue 34: "RSS bounded by one documented number") ----


def test_every_cache_is_bounded_in_bytes_or_by_entries_of_a_known_size() -> None:
    """The bound is the sum of the caches' bounds: a cache bounded by a count of entries
    of any size would make it no bound at all, so each says what one entry holds at most."""
    from ctxbudget.proxy.cache.registry import ENTRIES, cache_bytes

    for cache in CACHES:
        assert cache_bytes(cache, owners=3) >= 0, cache.where  # KeyError: no row in ENTRIES
    assert set(ENTRIES) <= registered(), "rows of ENTRIES for caches no longer registered"
    for where, entries in ENTRIES.items():
        bound = next(c.bound for c in CACHES if c.where == where)
        if entries.count > 1:  # the count is the registry's: one bound, written once
            assert f"{entries.count:,}" in bound or f"{entries.count // 2:,}" in bound, where
            assert ("an owner" in bound) == entries.per_owner, where


def test_the_entry_counts_are_the_ones_the_code_keeps() -> None:
    import inspect

    from ctxbudget.proxy.cache.registry import ENTRIES
    from ctxbudget.proxy.pipeline import summaries
    from ctxbudget.proxy.report import arms, ledger
    from ctxbudget.proxy.wire import responses, scan

    assert ENTRIES["proxy/report/arms.py:conversations"].count == arms.PER_OWNER
    assert ENTRIES["proxy/pipeline/summaries.py:tried"].count == summaries.TRIED_PER_OWNER
    assert ENTRIES["proxy/pipeline/summaries.py:_owners"].count == summaries.MAX_OWNERS
    assert ENTRIES["proxy/report/ledger.py:_held"].each == 4 * ledger.HELD_CHARS
    assert ENTRIES["proxy/wire/scan.py:_VALID"].count == scan._VALID.maxsize
    calls = inspect.signature(responses.CallNames).parameters["max_bytes"].default
    assert f"{calls >> 20} MB" in next(c.bound for c in CACHES if c.where.endswith(":_calls"))
    assert ENTRIES["proxy/wire/responses.py:_owners"].count == len_limit(responses.ResponseOwners)


def len_limit(kind: type) -> int:
    import inspect

    limit: int = inspect.signature(kind).parameters["limit"].default
    return limit


def test_the_memory_bound_is_the_caches_requests_and_worker_and_grows_with_owners() -> None:
    from ctxbudget.proxy.cache.registry import BASELINE, LITELLM, MB, cache_bytes, rss_bound
    from ctxbudget.proxy.config.schema import Config
    from ctxbudget.proxy.config.settings import settings_for
    from ctxbudget.proxy.pipeline.worker import WORKER_RSS

    cfg = Config()
    one = rss_bound(settings_for(cfg, {}), cfg.proxy.limits, worker_rss=WORKER_RSS)
    assert one.baseline == BASELINE
    assert one.caches == sum(cache_bytes(c) for c in CACHES)
    assert 400 * MB < one.caches < 1000 * MB  # the registry's bounds add up to this
    # 128 connections of one client, each with a 32 MiB body read and one sent upstream
    assert one.requests == 128 * 2 * 32 * MB
    assert one.worker == WORKER_RSS + 2 * 32 * MB
    assert one.total == one.baseline + one.caches + one.requests + one.worker

    keys = {"CTXBUDGET_PROXY_KEYS": ",".join(f"o{n}=key-{n}" for n in range(100))}
    routed = Config.model_validate({"proxy": {"routes": {"c": {"model": "anthropic/c"}}}})
    many = rss_bound(settings_for(routed, keys), cfg.proxy.limits, worker_rss=WORKER_RSS)
    assert many.baseline == BASELINE + LITELLM
    assert many.caches > one.caches  # the per-owner caches, 100 owners' worth
    four = rss_bound(settings_for(cfg, {}), cfg.proxy.limits, worker_rss=0, connections=4)
    assert four.requests == 4 * 2 * 32 * MB
    assert str(one).startswith(f"{one.total // MB:,} MB at most")


def test_the_architecture_doc_states_the_default_configs_bound() -> None:
    from ctxbudget.proxy.cache.registry import MB, rss_bound
    from ctxbudget.proxy.config.schema import Config
    from ctxbudget.proxy.config.settings import settings_for
    from ctxbudget.proxy.pipeline.worker import WORKER_RSS

    cfg = Config()
    bound = rss_bound(settings_for(cfg, {}), cfg.proxy.limits, worker_rss=WORKER_RSS)
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert f"| **in all** | **{bound.total // MB:,} MB** |" in doc
    assert f"| {bound.caches // MB} MB |" in doc
