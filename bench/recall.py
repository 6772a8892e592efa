"""Selection speed and quality on generated memory stores.

Builds stores of 1k, 10k and 100k memories (`--sizes`; texts of 6–14 words drawn from a
3,090-word vocabulary with Zipf frequencies, as in real text; imported in batches of 10,000),
and prints per size: import rate, DB
size, and recall p50/p99 per profile over the same queries. Then a quality run: in the 10k
store, 200 labelled "target" memories (one known relevant memory per query) among the
distractors, queried directly ("when is the orion project deadline?") and in a hard,
paraphrased form (the start of the project's name, and an abbreviation or synonym:
"orion due?" for the orionwave deadline); prints
recall@5 and MRR per profile.

    .venv/bin/python bench/recall.py              # ~3 minutes
    .venv/bin/python bench/recall.py --sizes 1000 # quick
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._stores import Store, close_store, open_store, settle, size_mb  # noqa: E402
from ctxbudget.memory import MemoryLimits, NewMemory  # noqa: E402
from ctxbudget.memory.profiles import PROFILES  # noqa: E402
from ctxbudget.memory.selection import select_memories  # noqa: E402
from ctxbudget.proxy.tokens import TokenCounter  # noqa: E402

WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
    "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu apple banana "
    "cherry grape lemon mango orange peach pear plum river mountain forest ocean desert valley "
    "meeting lunch dinner coffee tea report budget invoice review release sprint ticket "
    "customer vendor partner office remote travel flight hotel train garden kitchen music"
).split()
# (term in the memory, abbreviation or synonym a person types)
HARD = [
    ("configuration", "config"),
    ("authentication", "auth"),
    ("repository", "repo"),
    ("environment", "env"),
    ("performance", "perf"),
    ("documentation", "docs"),
    ("specification", "spec"),
    ("administrator", "admin"),
    ("application", "app"),
    ("deadline", "due"),
    ("deployment", "ship"),
    ("meeting", "sync"),
]
NAMES = [
    f"{a}{b}"
    for a in ("or", "ve", "ka", "lu", "ze", "mi", "ta", "ro")
    for b in (
        "ion",
        "ga",
        "ppa",
        "na",
        "ta",
        "ra",
        "x",
        "lo",
        "ne",
        "mo",
        "da",
        "ri",
        "va",
        "ko",
        "sa",
        "pi",
        "ne",
        "bu",
        "de",
        "fu",
        "gi",
        "ha",
        "jo",
        "ku",
        "le",
    )
][:200]


def vocabulary(rng: random.Random, size: int = 3000) -> tuple[list[str], list[float]]:
    """Pseudo-words with Zipf weights: a few common, most rare, as in real text."""
    syllables = [a + b for a in "bcdfghklmnprstvz" for b in "aeiou"]
    words = list(
        dict.fromkeys(
            "".join(rng.choice(syllables) for _ in range(rng.randint(2, 4)))
            for _ in range(size * 2)
        )
    )[:size]
    return WORDS + words, [1 / (rank + 1) ** 1.1 for rank in range(len(WORDS) + len(words))]


VOCAB, WEIGHTS = vocabulary(random.Random(3))


def distractor(rng: random.Random) -> str:
    count = rng.randint(6, 14)
    return " ".join(rng.choices(VOCAB, WEIGHTS, k=count)).capitalize()


def targets() -> list[tuple[str, str, str]]:
    """(memory text, direct query, hard query) for 200 labelled memories.

    Each memory names a project by a long codename ("orionwave"); the direct query uses the
    memory's own words, the hard one what people type: the start of the name and an
    abbreviation or synonym ("orion due?").
    """
    out = []
    suffixes = ("wave", "stone", "field", "works", "light")
    for i, name in enumerate(NAMES):
        term, short = HARD[i % len(HARD)]
        code = f"{name}{suffixes[i % len(suffixes)]}"
        text = f"The {code} project {term} notes live in the shared drive"
        out.append((text, f"where are the {code} project {term} notes", f"{name} {short}?"))
    return out


def build(
    folder: Path, name: str, size: int, rng: random.Random, url: str | None
) -> tuple[Store, float]:
    """A store of `size` memories imported in batches of 10,000 (as `memory import` adds
    them): neighbours within a batch lend each other context, recall's costliest case."""
    store = open_store(folder, name, MemoryLimits(max_memories=size + 1000), url)
    start = time.perf_counter()
    for first in range(0, size, 10_000):
        count = min(10_000, size - first)
        store.add_many([NewMemory(owner="default", text=distractor(rng)) for _ in range(count)])
    rate = size / (time.perf_counter() - start)
    settle(store)
    return store, rate


def timed_recall(
    store: Store, queries: list[str], profile: str, tokens: TokenCounter
) -> list[float]:
    out = []
    for q in queries:
        t = time.perf_counter()
        select_memories(
            store,
            "default",
            q,
            PROFILES[profile],
            profile,
            limits=store.limits,  # type: ignore[index]
            now=time.time(),
            max_chars=4000,
            count_tokens=lambda s: tokens.count(s, "o200k_base"),
        )
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument(
        "--database-url",
        help="postgresql://… : run on PostgreSQL (each store in a schema of its own, dropped "
        "after) instead of SQLite files",
    )
    parser.add_argument("--skip-quality", action="store_true", help="speed only")
    args = parser.parse_args()
    rng = random.Random(7)
    tokens = TokenCounter()
    tokens.count("warm up", "o200k_base")
    queries = [" ".join(rng.choices(VOCAB, WEIGHTS, k=rng.randint(2, 8))) for _ in range(200)]
    with tempfile.TemporaryDirectory() as tmp:
        print("size      import/s   DB MB   lean p50/p99 ms   balanced p50/p99   deep p50/p99")
        speeds: dict[int, dict[str, float]] = {}
        for size in args.sizes:
            name = f"m{size}"
            store, rate = build(Path(tmp), name, size, rng, args.database_url)
            row = {}
            cols = []
            for profile in ("lean", "balanced", "deep"):
                times = timed_recall(store, queries, profile, tokens)
                p50, p99 = (
                    statistics.median(times) * 1e3,
                    sorted(times)[int(0.99 * len(times))] * 1e3,
                )
                row[profile] = p50
                cols.append(f"{p50:6.2f} / {p99:6.2f}")
            speeds[size] = row
            mb = size_mb(store, Path(tmp), name)
            print(f"{size:>7,}  {rate:9,.0f}  {mb:6.1f}   " + "   ".join(cols))
            close_store(store)
        biggest = max(args.sizes)
        s = speeds[biggest]
        print(
            f"at {biggest:,}: lean is {s['deep'] / s['lean']:.1f}x faster than deep "
            "(target >= 3x); targets p50 lean <= 5 ms, deep <= 20 ms at 100k"
        )

        if args.skip_quality:
            return
        # quality: labelled targets among 10k distractors
        store, _ = build(Path(tmp), "quality", 10_000, random.Random(11), args.database_url)
        labelled = targets()
        ids = [store.add(NewMemory(owner="default", text=t))[0].id for t, _, _ in labelled]
        print("\nquality: 200 labelled memories among 10,000 distractors")
        print("profile     direct recall@5  MRR     hard recall@5  MRR")
        for profile in ("lean", "balanced", "deep"):
            cols = []
            for kind in (1, 2):
                hits, rr = 0, 0.0
                for memory_id, item in zip(ids, labelled, strict=True):
                    result = select_memories(
                        store,
                        "default",
                        item[kind],
                        PROFILES[profile],
                        profile,  # type: ignore[index]
                        limits=store.limits,
                        now=time.time(),
                        max_chars=100_000,
                        count_tokens=lambda s: tokens.count(s, "o200k_base"),
                    )
                    ranked = [c.memory.id for c in result.chosen]
                    if memory_id in ranked[:5]:
                        hits += 1
                    if memory_id in ranked:
                        rr += 1 / (ranked.index(memory_id) + 1)
                cols.append(f"{hits / len(ids) * 100:11.1f}%  {rr / len(ids):.3f}")
            print(f"{profile:<9} " + "   ".join(cols))
        close_store(store)


if __name__ == "__main__":
    main()
