"""Selection quality on real, labelled conversations: LoCoMo (snap-research/locomo).

The three conversations in `../shared/fixtures/locomo/` (not in this repository: CC BY-NC,
evaluation only). Each dialogue turn becomes a memory `[date] Speaker: text` (a conversation
is one import batch); each question (categories 1–4; 5, adversarial, has no evidence) is
recalled for as the proxy would
(`Recaller`, dry run, the memory feature limit of 4,000 chars, o200k tokens). A question is a
*hit* when a turn labelled as its evidence is among the memories injected.

Printed per retrieval profile and category: the hit rate and the mean number of memories
injected, then **hit@N**: the same profiles' rankings cut to the same N memories (so injecting
more cannot pass for ranking better), beside plain BM25 (SQLite FTS5, the question's words) at
the same N and at the count balanced injected.

    .venv/bin/python bench/recall_quality.py          # ~1 minute
    .venv/bin/python bench/recall_quality.py --n 5 10 20   # default: 5 10 14 (deep injects ≤ 14)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._stores import Store, close_store, open_store  # noqa: E402
from ctxbudget.memory import MemoryLimits, NewMemory  # noqa: E402
from ctxbudget.memory.profiles import PROFILES  # noqa: E402
from ctxbudget.memory.query import UserTurn  # noqa: E402
from ctxbudget.memory.recaller import Recaller, RecallRequest, RecallSettings  # noqa: E402
from ctxbudget.memory.selection import select_memories  # noqa: E402
from ctxbudget.proxy.tokens import TokenCounter  # noqa: E402

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
HARD = (1, 3)
MAX_CHARS = 4000  # memory.qmd.limits.maxInjectedChars: the cap with the budget off (default)
_WORD = re.compile(r"\w+")


def fixture_dir() -> Path:
    env = os.environ.get("CTXBUDGET_LOCOMO_FIXTURES")
    return Path(env) if env else ROOT.parent / "shared" / "fixtures" / "locomo"


def load_store(
    conversation: dict[str, Any], folder: Path, name: str, url: str | None
) -> tuple[Store, dict[int, str]]:
    """A store holding every turn of `conversation`; memory id → the turn's `dia_id`."""
    store = open_store(folder, name, MemoryLimits(max_memories=100_000), url)
    new: list[NewMemory] = []
    dia: list[str] = []
    session = 1
    while f"session_{session}" in conversation:
        date = conversation[f"session_{session}_date_time"]
        for turn in conversation[f"session_{session}"]:
            text = turn["text"]
            if turn.get("blip_caption"):
                text += f" [shares a photo: {turn['blip_caption']}]"
            new.append(
                NewMemory(owner="default", text=f"[{date}] {turn['speaker']}: {text}"[:2000])
            )
            dia.append(turn["dia_id"])
        session += 1
    # one batch, as `ctxbudget memory import` of the conversation would add it
    added, _ = store.add_many(new)
    return store, {memory.id: d for memory, d in zip(added, dia, strict=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[5, 10, 14], help="equal-count cuts")
    parser.add_argument(
        "--database-url", help="postgresql://… : the stores on PostgreSQL instead of SQLite"
    )
    args = parser.parse_args()
    folder = fixture_dir()
    files = sorted(folder.glob("*.json"))
    if not files:
        raise SystemExit(f"no LoCoMo conversations in {folder} (CTXBUDGET_LOCOMO_FIXTURES)")
    tokens = TokenCounter()
    profiles = ("lean", "balanced", "deep")
    hits: dict[tuple[str, int], list[bool]] = defaultdict(list)
    injected: dict[tuple[str, int], list[int]] = defaultdict(list)
    at_n: dict[tuple[str, int, int], list[bool]] = defaultdict(list)
    bm25_same: dict[int, list[bool]] = defaultdict(list)
    took: dict[str, list[float]] = defaultdict(list)
    questions = 0
    with tempfile.TemporaryDirectory() as tmp:
        for file in files:
            conversation = json.loads(file.read_text())
            store, ids = load_store(conversation, Path(tmp), file.stem, args.database_url)
            for qa in conversation["qa"]:
                category = qa.get("category")
                if category not in CATEGORIES or not qa.get("evidence"):
                    continue
                questions += 1
                evidence = set(qa["evidence"])
                question = qa["question"]
                turn = UserTurn(index=0, text=question, last=True)
                balanced_count = 0
                for name in profiles:
                    recaller = Recaller(store, RecallSettings(profile=name))  # type: ignore[arg-type]
                    started = time.perf_counter()
                    found = recaller.recall(
                        turn,
                        RecallRequest(
                            owner="default",
                            max_chars=MAX_CHARS,
                            count_tokens=lambda t: tokens.count(t, "o200k_base"),
                            dry_run=True,
                        ),
                    )
                    took[name].append(time.perf_counter() - started)
                    chosen = [m["id"] for m in found.report.memories] if found else []
                    hits[(name, category)].append(any(ids[i] in evidence for i in chosen))
                    injected[(name, category)].append(len(chosen))
                    if name == "balanced":
                        balanced_count = len(chosen)
                    ranked = _ranking(store, question, name, tokens)
                    for n in args.n:
                        at_n[(name, category, n)].append(
                            any(ids[i] in evidence for i in ranked[:n])
                        )
                words = " ".join(_WORD.findall(question.lower()))
                plain = [m.id for m, _ in store.search("default", words, limit=max(args.n))]
                for n in args.n:
                    at_n[("plain BM25", category, n)].append(
                        any(ids[i] in evidence for i in plain[:n])
                    )
                bm25_same[category].append(any(ids[i] in evidence for i in plain[:balanced_count]))
            close_store(store)
    print(f"\nLoCoMo: {len(files)} conversations, {questions} questions (categories 1-4)")
    cats = [*CATEGORIES, "hard", "all"]
    head = f"{'profile':<28}" + "".join(f"{_title(c):>13}" for c in cats) + f"{'injected':>10}"
    print("\nhit rate (an evidence turn among the memories injected)")
    print(head)
    for name in profiles:
        row = "".join(f"{_rate(hits, name, c):>13}" for c in cats)
        count = statistics.mean(v for c in CATEGORIES for v in injected[(name, c)])
        print(f"{name:<28}{row}{count:>10.1f}")
    same = {(("plain BM25", c)): bm25_same[c] for c in CATEGORIES}
    row = "".join(f"{_rate(same, 'plain BM25', c):>13}" for c in cats)
    print(f"{'plain BM25, balanced count':<28}{row}{'—':>10}")
    for n in args.n:
        print(f"\nhit@{n} (each ranking cut to the same {n} memories)")
        print(head[:-10])
        for name in (*profiles, "plain BM25"):
            cut = {(name, c): at_n[(name, c, n)] for c in CATEGORIES}
            print(f"{name:<28}" + "".join(f"{_rate(cut, name, c):>13}" for c in cats))
    print("\nrecall time per question (dry run, ~1-2k memories per store), p50:")
    for name in profiles:
        print(f"  {name:<10} {statistics.median(took[name]) * 1000:.2f} ms")
    _verdict(hits, injected, at_n, args.n)


def _verdict(
    hits: dict[tuple[str, int], list[bool]],
    injected: dict[tuple[str, int], list[int]],
    at_n: dict[tuple[str, int, int], list[bool]],
    cuts: list[int],
) -> None:
    """Issue 13's target: deep >= balanced + 10 points on hard questions while injecting at
    most 1.5x as many memories, and ahead of balanced at every equal count."""

    def hard(table: dict[Any, list[bool]], name: str) -> float:
        values = [v for c in HARD for v in table.get((name, c), [])]
        return 100 * sum(values) / len(values) if values else 0.0

    def count(name: str) -> float:
        return statistics.mean(v for c in CATEGORIES for v in injected[(name, c)])

    gap = hard(hits, "deep") - hard(hits, "balanced")
    ratio = count("deep") / (count("balanced") or 1)
    print(
        f"\ndeep - balanced on hard questions: {gap:+.1f} points at {ratio:.2f}x the memories"
        f" (target: >= +10 at <= 1.5x): {'met' if gap >= 10 and ratio <= 1.5 else 'NOT met'}"
    )
    for n in cuts:
        cut = {name: {(name, c): at_n[(name, c, n)] for c in HARD} for name in ("balanced", "deep")}
        ahead = hard(cut["deep"], "deep") - hard(cut["balanced"], "balanced")
        print(f"  at {n} memories each: deep {ahead:+.1f} points on hard questions")


def _ranking(store: Store, question: str, name: str, tokens: TokenCounter) -> list[int]:
    """Memory ids in `name`'s score order, before any budget cut (no injection cap)."""
    result = select_memories(
        store,
        "default",
        question,
        PROFILES[name],
        "bench",
        limits=store.limits,
        now=time.time(),
        max_chars=10**9,
        count_tokens=lambda t: tokens.count(t, "o200k_base"),
    )
    ordered = sorted(result.candidates, key=lambda c: -c.score)
    return [c.memory.id for c in ordered]


def _rate(table: dict[Any, list[bool]], name: str, category: int | str) -> str:
    if category == "all":
        values = [v for c in CATEGORIES for v in table.get((name, c), [])]
    elif category == "hard":
        values = [v for c in HARD for v in table.get((name, c), [])]
    else:
        values = table.get((name, category), [])
    return f"{100 * sum(values) / len(values):.1f}%" if values else "—"


def _title(category: int | str) -> str:
    return CATEGORIES.get(category, str(category)) if isinstance(category, int) else category


if __name__ == "__main__":
    main()
