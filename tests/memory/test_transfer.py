"""Memories in and out (issue 13, item 1): JSONL both ways, OpenClaw's Markdown in; a batch is
all or nothing, and fast."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ctxbudget.memory import InvalidMemory, MemoryLimits, NewMemory, SQLiteMemoryStore
from ctxbudget.memory.transfer import export_jsonl, parse_jsonl, parse_markdown
from tests.conftest import Backend
from tests.proxy.test_cli import Dirs, dirs, run, write_config  # noqa: F401 (a fixture)

MEMORY_MD = """# MEMORY

## People
- Alice prefers green tea
- Bob is on call
  on Fridays
1. Standup moved to 9:30

<!-- private
- not a memory
-->
```
- nor this
```
The office is in Oslo.
It opens at eight.

---
"""


def test_markdown_gives_one_memory_per_bullet_or_paragraph() -> None:
    texts = [m.text for m in parse_markdown(MEMORY_MD, "me", category="preference")]
    assert texts == [
        "Alice prefers green tea",
        "Bob is on call on Fridays",
        "Standup moved to 9:30",
        "The office is in Oslo. It opens at eight.",
    ]


def test_jsonl_round_trips_through_a_store(tmp_path: Path) -> None:
    store = SQLiteMemoryStore(tmp_path / "m.db", limits=MemoryLimits(max_memories=1000))
    lines = [
        {"text": "Likes tea", "category": "preference", "created": "2024-03-01T08:00:00Z"},
        {"text": "Deploys on Fridays", "scope": "agent:coder", "source": "inferred"},
    ]
    store.add_many(parse_jsonl("\n".join(json.dumps(x) for x in lines) + "\n\n", "me"))
    exported = export_jsonl(store.all("me"))
    again = SQLiteMemoryStore(tmp_path / "n.db", limits=MemoryLimits(max_memories=1000))
    again.add_many(parse_jsonl(exported, "me"))
    assert export_jsonl(again.all("me")) == exported
    first = json.loads(exported.splitlines()[0])
    assert first == {
        "text": "Likes tea",
        "category": "preference",
        "source": "user_explicit",
        "scope": "global",
        "created": "2024-03-01T08:00:00+00:00",
    }
    store.close()
    again.close()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"text": "ok"}\n{"text": "x", "category": "gossip"}\n', "line 2: unknown category"),
        ('{"text": "ok"}\n\n{nope\n', "line 3: not JSON"),
        ('["text"]\n', "line 1: expected an object with a text"),
        ('{"text": "ok", "created": "yesterday"}\n', "line 1: created must be an ISO 8601"),
        ('{"text": "ok", "colour": "red"}\n', "line 1: unknown field(s) colour"),
        # issue 24, item 12: a traceback before
        (
            '{"text": "ok"}\n' + "[" * 100_000 + "]" * 100_000 + "\n",
            "line 2: JSON nested too deeply",
        ),
        ('{"text": "tea\\ud800"}\n', "line 1: text contains a lone surrogate (U+D800) at 3"),
        ('{"text": "ok", "category": "f\\udc00"}\n', "line 1: category contains a lone surrogate"),
        ('{"text": "tea\\u0000"}\n', "line 1: text contains a NUL character"),
    ],
)
def test_a_bad_line_is_named_and_nothing_is_written(
    dirs: Dirs,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    text: str,
    message: str,
) -> None:
    config = write_config(dirs.work / "ctxbudget.jsonc", dirs)
    (dirs.work / "in.jsonl").write_text(text)
    code, out, err = run(capsys, "memory", "import", "in.jsonl", "--config", str(config))
    assert code == 2 and message in err and "nothing imported from in.jsonl" in err
    assert run(capsys, "memory", "export", "--config", str(config))[1] == ""


def test_import_and_export_on_the_command_line(
    dirs: Dirs,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = write_config(dirs.work / "ctxbudget.jsonc", dirs, {"memory": {"maxMemories": 20_000}})
    (dirs.work / "MEMORY.md").write_text(MEMORY_MD)
    code, out, _ = run(capsys, "memory", "import", "MEMORY.md", "--config", str(config))
    assert code == 0 and out.startswith("imported 4 memories from MEMORY.md in ")
    code, exported, _ = run(capsys, "memory", "export", "--config", str(config))
    assert [json.loads(x)["text"] for x in exported.splitlines()][0] == "Alice prefers green tea"
    batch = "".join(
        json.dumps({"text": f"Note {i} about project {i % 97}"}) + "\n" for i in range(10_000)
    )
    (dirs.work / "big.jsonl").write_text(batch)
    started = time.perf_counter()
    code, out, _ = run(capsys, "memory", "import", "big.jsonl", "--json", "--config", str(config))
    took = time.perf_counter() - started
    assert code == 0 and json.loads(out) == {"imported": 10_000, "alreadyThere": 0, "evicted": []}
    assert took < 30  # a generous bound; the rate is measured in the note, not here
    code, found, _ = run(capsys, "memory", "search", "project", "--json", "--config", str(config))
    assert code == 0 and len(json.loads(found)) > 0


def test_an_export_imported_back_adds_nothing_twice(
    dirs: Dirs,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 23: `memory export` then `memory import` duplicated every memory."""
    config = write_config(dirs.work / "ctxbudget.jsonc", dirs)
    (dirs.work / "MEMORY.md").write_text(MEMORY_MD + "\n- Alice  prefers green tea\n")
    code, out, _ = run(capsys, "memory", "import", "MEMORY.md", "--config", str(config))
    assert out.startswith("imported 4 memories") and "1 already there" in out
    _, exported, _ = run(capsys, "memory", "export", "--config", str(config))
    (dirs.work / "back.jsonl").write_text(exported + json.dumps({"text": "New one"}) + "\n")
    code, out, _ = run(capsys, "memory", "import", "back.jsonl", "--json", "--config", str(config))
    assert json.loads(out) == {"imported": 1, "alreadyThere": 4, "evicted": []}
    _, again, _ = run(capsys, "memory", "export", "--config", str(config))
    assert len(again.splitlines()) == 5
    # the same text in another scope is another memory
    scoped = json.dumps({"text": "Bob is on call on Fridays", "scope": "agent:ops"}) + "\n"
    (dirs.work / "scoped.jsonl").write_text(scoped)
    code, out, _ = run(
        capsys, "memory", "import", "scoped.jsonl", "--json", "--config", str(config)
    )
    assert json.loads(out)["imported"] == 1


def test_markdown_headings_that_name_a_category_set_it() -> None:
    """Issue 23: OpenClaw's MEMORY.md groups memories under `## Preferences`, `## Facts`…"""
    notes = (
        "# MEMORY\n- loose note\n## Preferences\n- Green tea\n### Food\n- No onions\n"
        "## Patterns:\n- Deploys on Fridays\n## People\n- Alice leads zebra\n"
        "```\n## Facts\n```\n- still people\n"
    )
    got = [
        (m.text, m.category)
        for m in parse_markdown(
            notes, "me", category="fact", categories=["preference", "fact", "pattern"]
        )
    ]
    assert got == [
        ("loose note", "fact"),
        ("Green tea", "preference"),
        ("No onions", "preference"),  # a sub-heading naming none keeps its parent's
        ("Deploys on Fridays", "pattern"),
        ("Alice leads zebra", "fact"),  # a heading naming none: the default again
        ("still people", "fact"),  # a heading in a code fence is code
    ]


def test_a_markdown_import_on_the_command_line_takes_the_headings_categories(
    dirs: Dirs,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = write_config(dirs.work / "ctxbudget.jsonc", dirs)
    (dirs.work / "MEMORY.md").write_text("## Preferences\n- Green tea\n## Facts\n- Oslo\n")
    run(capsys, "memory", "import", "MEMORY.md", "--category", "pattern", "--config", str(config))
    _, exported, _ = run(capsys, "memory", "export", "--config", str(config))
    assert [json.loads(x)["category"] for x in exported.splitlines()] == ["preference", "fact"]


def test_a_batch_larger_than_the_limit_is_refused_whole(tmp_path: Path) -> None:
    store = SQLiteMemoryStore(tmp_path / "m.db", limits=MemoryLimits(max_memories=3))
    with pytest.raises(InvalidMemory, match="4 memories are more than memory.maxMemories"):
        store.add_many(
            parse_jsonl("".join(json.dumps({"text": f"m{i}"}) + "\n" for i in range(4)), "me")
        )
    store.add_many(parse_jsonl('{"text": "old"}\n', "me"))
    added, evicted = store.add_many(
        parse_jsonl('{"text": "a"}\n{"text": "b"}\n{"text": "c"}\n', "me")
    )
    assert [m.text for m in added] == ["a", "b", "c"] and [m.text for m in evicted] == ["old"]
    store.close()


def test_an_import_with_a_byte_order_mark_or_a_future_date_is_taken_as_meant(
    dirs: Dirs,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A UTF-8 BOM (Notepad's) is skipped, not a bad first line; a `created` time in the
    future is stored as now, so the memory ages like the others (issue 24, item 12)."""
    config = write_config(dirs.work / "ctxbudget.jsonc", dirs)
    lines = [
        {"text": "Alice prefers green tea", "created": "2024-03-01T08:00:00Z"},
        {"text": "Bob is on call", "created": "2999-01-01T00:00:00Z"},
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    (dirs.work / "in.jsonl").write_bytes(b"\xef\xbb\xbf" + text.encode())
    (dirs.work / "in.md").write_bytes(b"\xef\xbb\xbf- Carol runs the Oslo office\n")
    before = time.time()
    code, out, err = run(capsys, "memory", "import", "in.jsonl", "--config", str(config))
    assert code == 0, err
    code, out, err = run(capsys, "memory", "import", "in.md", "--config", str(config))
    assert code == 0, err
    code, exported, _ = run(capsys, "memory", "list", "--json", "--config", str(config))
    found = {m["text"]: m["created"] for m in json.loads(exported)}
    assert list(found) == [
        "Alice prefers green tea",
        "Bob is on call",
        "Carol runs the Oslo office",
    ]
    assert found["Alice prefers green tea"] == 1709280000.0
    assert before <= found["Bob is on call"] <= time.time()


def test_a_future_created_time_is_stored_as_now_by_either_store(backend: Backend) -> None:
    store = backend.open(clock=lambda: 1_800_000_000.0)
    added, _ = store.add_many(
        [NewMemory(owner="o", text="from the future", created=32_000_000_000.0)]
    )
    assert added[0].created == 1_800_000_000.0
