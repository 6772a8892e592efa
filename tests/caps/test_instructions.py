from __future__ import annotations

import doctest

from hypothesis import given, settings
from hypothesis import strategies as st

import ctxbudget.caps.instructions
from ctxbudget.caps import Caps, clamp_request
from ctxbudget.caps._text import utf16_len
from ctxbudget.caps.instructions import clamp_instructions

PREAMBLE = (
    "<system-reminder>\nCodebase and user instructions are shown below. Be sure to adhere to "
    "these instructions. IMPORTANT: These instructions OVERRIDE any default behavior and you "
    "MUST follow them exactly as written.\n\n"
)
PROJECT = "project instructions, checked into the codebase"
LOCAL = "user's private project instructions, not checked in"
GLOBAL = "user's private global instructions for all projects"


def reminder(*files: tuple[str, str, str]) -> str:
    """Claude Code 2.1.330's instruction block: (path, description, body) per file."""
    sections = "\n\n".join(f"Contents of {p} ({d}):\n\n{b}" for p, d, b in files)
    return f"{PREAMBLE}{sections}\n</system-reminder>"


def agents_md(directory: str, body: str) -> str:
    """Codex 0.169.0's AGENTS.md part."""
    return f"# AGENTS.md instructions for {directory}\n\n<INSTRUCTIONS>\n{body}\n</INSTRUCTIONS>"


RULES = "".join(f"Rule {i}: keep answers short and the workspace tidy.\n" for i in range(700))


def test_doctests() -> None:
    assert doctest.testmod(ctxbudget.caps.instructions).failed == 0


def test_each_claude_code_file_is_one_segment_and_only_bodies_change() -> None:
    text = reminder(
        ("/home/u/.claude/CLAUDE.md", GLOBAL, "# User rules\n\nAlways be kind."),
        ("/w/CLAUDE.md", PROJECT, RULES[:30_000]),
        ("/w/CLAUDE.local.md", LOCAL, "# Local\n\nMy notes."),
    )
    out, segments = clamp_instructions(text, 8000)
    assert [(s.label, s.action) for s in segments] == [
        ("/home/u/.claude/CLAUDE.md", "kept"),
        ("/w/CLAUDE.md", "clamped"),
        ("/w/CLAUDE.local.md", "kept"),
    ]
    big = segments[1]
    assert (big.before, big.after, big.cap) == (30_000, 8000, 8000)
    assert big.note == f"Claude Code: {PROJECT}"
    assert out.startswith(PREAMBLE)
    assert out.endswith(
        "Contents of /w/CLAUDE.local.md ("
        + LOCAL
        + "):\n\n# Local\n\nMy notes.\n</system-reminder>"
    )
    assert "[...truncated, read /w/CLAUDE.md for full content...]" in out
    body = out.split(f"Contents of /w/CLAUDE.md ({PROJECT}):\n\n", 1)[1].split("\n\nContents of ")[
        0
    ]
    assert utf16_len(body) == 8000
    assert body.startswith("Rule 0: keep") and RULES[:30_000].endswith(body[-200:])
    assert out.count("Contents of ") == text.count("Contents of ")


def test_codex_agents_md_is_the_text_inside_instructions() -> None:
    text = agents_md("/w", "# Global\n\nBe brief.\n\n--- project-doc ---\n\n" + RULES[:30_000])
    out, [segment] = clamp_instructions(text, 8000)
    assert (segment.label, segment.action, segment.after) == ("/w/AGENTS.md", "clamped", 8000)
    assert out.startswith(
        "# AGENTS.md instructions for /w\n\n<INSTRUCTIONS>\n# Global\n\nBe brief."
    )
    assert out.endswith("\n</INSTRUCTIONS>")
    assert "[...truncated, read /w/AGENTS.md for full content...]" in out


def test_what_is_not_an_agents_wrapper_is_never_touched() -> None:
    for text in (
        "Please follow CLAUDE.md\n\nContents of /w/CLAUDE.md (project instructions):\n\n" + RULES,
        " <system-reminder>\nContents of x (y):\n\n" + RULES,  # not at the start
        "<system-reminder>\nno end tag\n\nContents of /w/CLAUDE.md (p):\n\n" + RULES,
        "# AGENTS.md instructions for /w\n" + RULES,  # no <INSTRUCTIONS>
        "/ctxbudget",
    ):
        out, _ = clamp_instructions(text, 100)
        assert out is text


def test_claude_code_reminders_of_other_kinds_are_left_alone() -> None:
    text = (
        "<system-reminder>\nThe user opened the file x.py.\n" + "x" * 9000 + "\n</system-reminder>"
    )
    assert clamp_instructions(text, 100) == (text, [])


def test_only_the_first_user_message_and_not_the_users_own_part() -> None:
    block = reminder(("/w/CLAUDE.md", PROJECT, RULES))
    first = {
        "role": "user",
        "content": [
            {"type": "text", "text": block, "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": RULES},  # the user pasted the same text: theirs
        ],
    }
    later = {"role": "user", "content": [{"type": "text", "text": block}]}
    request = {"messages": [first, {"role": "assistant", "content": "ok"}, later]}
    result = clamp_request(request, Caps(bootstrap_max_chars=2000))
    assert [(s.label, s.message_index) for s in result.segments] == [("/w/CLAUDE.md", 0)]
    new_first = result.request["messages"][0]
    assert new_first["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert new_first["content"][1] is first["content"][1]
    assert result.request["messages"][2] is later
    assert clamp_request(result.request, Caps(bootstrap_max_chars=2000)).changed is False


def test_a_string_content_keeps_what_follows_the_reminder() -> None:
    text = reminder(("/w/CLAUDE.md", PROJECT, RULES)) + "\n/ctxbudget"
    result = clamp_request(
        {"messages": [{"role": "user", "content": text}]}, Caps(bootstrap_max_chars=500)
    )
    assert result.request["messages"][0]["content"].endswith("</system-reminder>\n/ctxbudget")


def test_a_header_line_of_any_length_is_read_in_linear_time() -> None:
    import time

    line = "\n\nContents of " + " (" * 200_000 + "):\n"
    text = PREAMBLE[:-1] + line * 3 + "\n</system-reminder>"
    # this thread's CPU time, not the wall clock's: the cost, whatever else the machine runs
    started = time.thread_time()
    out, segments = clamp_instructions(text, 10)
    assert time.thread_time() - started < 2
    assert len(segments) == 3 and out == text  # empty bodies


_PIECES = "Contents of | (|):|\n|\n\n|</system-reminder>|<system-reminder>\n|x|📦|/w/CLAUDE.md"
crafted = st.lists(st.sampled_from(_PIECES.split("|")), max_size=60).map("".join)
files = st.lists(
    st.tuples(
        st.sampled_from(["/w/CLAUDE.md", "/h/.claude/CLAUDE.md", "/w/My (copy)/CLAUDE.local.md"]),
        st.sampled_from([PROJECT, LOCAL, GLOBAL]),
        st.text(
            st.characters(min_codepoint=1, max_codepoint=0x1F64F, exclude_categories=("Cs",)),
            max_size=3000,
        )
        | crafted,
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=150, deadline=None)
@given(files=files, cap=st.integers(min_value=0, max_value=3500))
def test_claude_code_properties(files: list[tuple[str, str, str]], cap: int) -> None:
    text = reminder(*files)
    out, segments = clamp_instructions(text, cap)
    assert all(s.after <= cap for s in segments)  # never over the cap
    assert clamp_instructions(text, cap)[0] == out  # deterministic
    assert clamp_instructions(out, cap)[0] == out  # idempotent
    assert out.startswith(PREAMBLE) and out.endswith("\n</system-reminder>")


@settings(max_examples=150, deadline=None)
@given(
    body=st.text(
        st.characters(min_codepoint=1, max_codepoint=0x1F64F, exclude_categories=("Cs",)),
        max_size=4000,
    )
    | st.lists(st.sampled_from(["</INSTRUCTIONS>", "\n", "x", "<INSTRUCTIONS>\n"])).map("".join),
    cap=st.integers(min_value=0, max_value=4500),
)
def test_codex_properties(body: str, cap: int) -> None:
    text = agents_md("/w", body)
    out, [segment] = clamp_instructions(text, cap)
    assert segment.after <= cap
    assert clamp_instructions(text, cap)[0] == out
    assert clamp_instructions(out, cap)[0] == out
    assert out.startswith("# AGENTS.md instructions for /w\n\n<INSTRUCTIONS>\n")
    assert out.endswith("\n</INSTRUCTIONS>")
