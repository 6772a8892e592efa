from __future__ import annotations

import doctest
import re
import time

from hypothesis import given, settings
from hypothesis import strategies as st

import ctxbudget.caps.bootstrap
from ctxbudget.caps._text import utf16_len
from ctxbudget.caps.bootstrap import clamp_body, clamp_system_text
from tests.openclaw import default_files, load_fixtures, system_prompt

MARKERS = re.compile(
    r"<!--[^>]*-->|^# (?:Dynamic )?Project Context$|^## (?:/|[A-Za-z]:\\|\./)?\S*\.md$"
    r"|^## (?:Silent Replies|Runtime|Heartbeats|Temporal Context)$",
    re.M,
)


def _outside_bodies(text: str) -> list[str]:
    """Headings and comment markers: everything a clamp must leave alone."""
    return MARKERS.findall(text)


def test_doctests() -> None:
    assert doctest.testmod(ctxbudget.caps.bootstrap).failed == 0


def test_9x_layout_clamps_each_file_to_its_cap() -> None:
    prompt = system_prompt(version="9.x")
    text, segments = clamp_system_text(prompt, 2000)
    by_name = {s.label.rsplit("/", 1)[1]: s for s in segments}
    assert list(by_name) == [
        "AGENTS.md",
        "SOUL.md",
        "IDENTITY.md",
        "USER.md",
        "BOOTSTRAP.md",
        "MEMORY.md",
    ]
    assert by_name["AGENTS.md"].action == "clamped" and by_name["AGENTS.md"].after == 2000
    assert by_name["SOUL.md"].action == "kept" and by_name["SOUL.md"].after == 19
    assert by_name["BOOTSTRAP.md"].note == "missing file"
    assert "[...truncated, read AGENTS.md for full content...]" in text
    assert "…(truncated AGENTS.md: kept " in text
    assert _outside_bodies(text) == _outside_bodies(prompt)
    assert text.startswith("<!-- openclaw:attempt:STABLE -->\n")


def test_4x_layout_includes_the_dynamic_block() -> None:
    prompt = system_prompt(version="4.x", heartbeat="# HEARTBEAT\n" + "check mail\n" * 500)
    text, segments = clamp_system_text(prompt, 1000)
    names = [s.label.rsplit("/", 1)[1] for s in segments]
    assert names[-1] == "HEARTBEAT.md"
    assert segments[-1].action == "clamped"
    assert "\n<!-- OPENCLAW_CACHE_BOUNDARY -->\n" in text
    assert _outside_bodies(text) == _outside_bodies(prompt)


def test_file_bodies_may_hold_their_own_headings() -> None:
    files = {
        "AGENTS.md": "# Rules\n## Safety\n" + "never do x\n" * 300 + "## Tail\nend",
        "SOUL.md": "# SOUL\nBe kind.",
    }
    text, segments = clamp_system_text(system_prompt(files=files), 500)
    assert [s.label.rsplit("/", 1)[1] for s in segments] == ["AGENTS.md", "SOUL.md"]
    assert segments[0].before == utf16_len(files["AGENTS.md"])
    assert segments[1].action == "kept"
    assert text.endswith("<!-- /openclaw:attempt:DYNAMIC -->")


def test_windows_and_relative_paths_are_headings() -> None:
    for path in ("C:\\Users\\me\\ws\\AGENTS.md", "./AGENTS.md", "AGENTS.md"):
        prompt = f"# Project Context\nLoaded project context:\n## {path}\n{'a' * 50}\n## Runtime\nx"
        _, [segment] = clamp_system_text(prompt, 10)
        assert segment.label == path and segment.after <= 10


def test_not_a_bootstrap_heading_is_part_of_the_body() -> None:
    prompt = "# Project Context\nLoaded project context:\n## /w/AGENTS.md\nx\n## /w/NOTES.md\ny"
    _, [segment] = clamp_system_text(prompt, None)
    assert segment.original == "x\n## /w/NOTES.md\ny"


def test_no_project_context_returns_the_same_text() -> None:
    text = "You are helpful.\n## /w/AGENTS.md\nnot in a block"
    assert clamp_system_text(text, 10) == (text, [])
    assert clamp_system_text(text, 10)[0] is text


def test_cap_none_reports_without_changing() -> None:
    prompt = system_prompt()
    text, segments = clamp_system_text(prompt, None)
    assert text is prompt
    assert {s.action for s in segments} == {"kept"}


def test_already_truncated_files_report_the_original_size() -> None:
    body = (
        "h" * 9000 + "\n\n[...truncated, read AGENTS.md for full content...]\n"
        "…(truncated AGENTS.md: kept 9000+policy 6974+3000 chars of 41215)…\n\n" + "t" * 3000
    )
    out = clamp_body(body, 4000, "AGENTS.md")
    assert "chars of 41215)…" in out and utf16_len(out) <= 4000
    compact = "x" * 100 + "[…truncated 90+10/5000]" + "y" * 100
    assert "/5000]" in clamp_body(compact, 80, "USER.md")
    _, [segment] = clamp_system_text(
        f"# Project Context\nLoaded project context:\n## /w/AGENTS.md\n{body}", 4000
    )
    assert segment.note == "already truncated by OpenClaw (raw 41,215)"
    assert segment.before == utf16_len(body)


def test_astral_characters_are_never_split() -> None:
    body = "\U0001f600" * 5000
    out = clamp_body(body, 1001, "USER.md")
    assert utf16_len(out) <= 1001
    out.encode("utf-8")  # raises on a lone surrogate


def test_captured_prompts_stay_within_caps_with_markers_intact() -> None:
    for name, request in load_fixtures():
        prompt = request["messages"][0]["content"]
        text, segments = clamp_system_text(prompt, 3000)
        assert segments, name
        assert all(s.after <= 3000 for s in segments), name
        assert _outside_bodies(text) == _outside_bodies(prompt), name
        assert clamp_system_text(text, 3000)[0] == text, name


bodies = st.text(
    st.characters(min_codepoint=1, max_codepoint=0x1F64F, exclude_categories=("Cs",)), max_size=3000
)


@settings(max_examples=150, deadline=None)
@given(
    body=bodies,
    cap=st.integers(min_value=0, max_value=3500),
    name=st.sampled_from(["AGENTS.md", "USER.md"]),
)
def test_clamp_body_properties(body: str, cap: int, name: str) -> None:
    out = clamp_body(body, cap, name)
    assert utf16_len(out) <= cap and len(out) <= cap  # both units
    assert clamp_body(body, cap, name) == out  # deterministic
    assert clamp_body(out, cap, name) == out  # idempotent
    if utf16_len(body) <= cap:
        assert out == body


@settings(max_examples=60, deadline=None)
@given(
    agents=bodies,
    user=bodies,
    cap=st.integers(min_value=0, max_value=4000),
    version=st.sampled_from(["4.x", "9.x"]),
)
def test_system_text_properties(agents: str, user: str, cap: int, version: str) -> None:
    files = {
        **default_files(agents_chars=0),
        "AGENTS.md": agents.replace("\n## ", "\n# "),
        "USER.md": user.replace("\n## ", "\n# "),
    }
    prompt = system_prompt(version=version, files=files)
    text, segments = clamp_system_text(prompt, cap)
    assert all(s.after <= cap for s in segments)
    assert clamp_system_text(text, cap)[0] == text
    assert clamp_system_text(prompt, cap)[0] == text
    assert _outside_bodies(text) == _outside_bodies(prompt)


# -- crafted text (issue 24): work stays linear in the prompt --------------------------------

_PROMPT = "# Project Context\nLoaded project context:\n"


def _raw_size_by_trying_each_marker(body: str) -> int | None:
    """What `_raw_size` must answer: every probe tried in turn (the quadratic original)."""
    for probe, pattern in (
        ("…(truncated ", ctxbudget.caps.bootstrap._TRUNCATED),
        ("[…truncated ", ctxbudget.caps.bootstrap._TRUNCATED_COMPACT),
    ):
        for found in re.finditer(re.escape(probe), body):
            match = pattern.match(body, found.start())
            if match:
                return int(match.group(1))
    return None


_PIECES = "…(truncated |[…truncated |AGENTS.md|: kept |12|+|policy 3+| chars of |900|)…|]|/|:|\n|x"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_PIECES.split("|")), max_size=40))
def test_the_raw_size_is_the_first_marker_that_parses(pieces: list[str]) -> None:
    body = "".join(pieces)
    assert ctxbudget.caps.bootstrap._raw_size(body) == _raw_size_by_trying_each_marker(body)


def test_a_body_of_truncation_markers_is_read_in_linear_time() -> None:
    # 400 KB of `…(truncated ` took minutes when each marker was tried to the line's end
    # (136 KB: 10 s, 240 KB: 53 s in the issue); now one pass
    body = "…(truncated " * 34_000 + "\n…(truncated AGENTS.md: kept 9+3 chars of 777)…"
    # this thread's CPU time, not the wall clock's: the cost, whatever else the machine runs
    started = time.thread_time()
    text, [segment] = clamp_system_text(f"{_PROMPT}## /w/AGENTS.md\n{body}", None)
    assert time.thread_time() - started < 2
    assert text.endswith(body)
    assert segment.note == "already truncated by OpenClaw (raw 777)"


def test_repeated_project_context_blocks_never_overlap() -> None:
    # each block ran to the end of the prompt, so every later file was found again in every
    # earlier block: 4,000 blocks made 8 million segments and overlapping cuts
    prompt = "\n".join([f"{_PROMPT}## /w/AGENTS.md\n" + "a" * 40] * 4000)
    text, segments = clamp_system_text(prompt, 20)
    assert len(segments) == 4000
    assert {(s.before, s.after) for s in segments} == {(40, 20)}
    assert text.count(_PROMPT) == 4000 and len(text) < len(prompt)
