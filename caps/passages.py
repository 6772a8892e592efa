"""Keep what the question asks: a text's head plus the passages that best answer a question.

A head-only clamp keeps the wrong 8,000 chars of most pages: what a user asks about is usually
further down. `pick` splits a text along its own structure — paragraphs, headings, lines of a
log or of a dialogue, grouped until a passage says something — scores each passage against the
question with BM25 (Okapi: k1 = 1.2, b = 0.75, lengths in characters), and keeps the head (the
title, what the text is) then the best passages, in document order, within the same room. Each
gap says inline what was skipped and how to get it. Command outputs (`errors=True`) keep their
error lines and tracebacks first, whatever the question.

Deterministic, in-process, no model: one regular-expression pass over the text finds every
question term (words that start with a term's stem, case-insensitive), so a 100 KB page costs
about a millisecond (`bench/evidence.py`). The caller freezes the decision by construction: the
question comes only from what precedes the result in the conversation (`caps.question`).

>>> page = "# Trip notes\\n\\n" + "".join(
...     f"Day {i}: walked around the old town and had lunch.\\n\\n" for i in range(200))
>>> page += "Day 200: the ferry to the island leaves at 7:15 from pier 4.\\n\\n"
>>> page += "".join(f"Day {i}: rested.\\n\\n" for i in range(201, 300))
>>> out = pick(page, 1200, "when does the ferry leave?", how="ask web_fetch for the rest")
>>> print(out[:62])
# Trip notes
<BLANKLINE>
Day 0: walked around the old town and had lunch.
>>> "ferry to the island leaves at 7:15" in out, utf16_len(out) <= 1200
(True, True)
>>> print(out[out.index("[...skipped"):].splitlines()[0])
[...skipped chars 973-10,304; ask web_fetch for the rest...]
>>> pick(page, 1200, "", how="") is None         # nothing asked: the caller cuts the head
True
>>> pick(page, 1200, "zebra crossing", how="") is None   # nothing matches: the head too
True
>>> pick("short", 1200, "short", how="") == "short"      # under the room: as it is
True
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Sequence
from itertools import islice

from ctxbudget.caps._text import utf16_head, utf16_len

HEAD_SHARE = 0.2
"""What of the room goes to the head first: a page's title and what it is about."""
MIN_ROOM = 800
"""Under this many units a query clamp has no room for passages and gaps: the head cut."""
MIN_PASSAGE = 240
"""Lines are grouped into one passage until it is this long (a dialogue turn, a log line
alone says too little), unless a blank line or a heading ends it first."""
MAX_PASSAGE = 1000
"""A longer line (minified text, a one-line JSON) is split into pieces of at most this."""
K1 = 1.2
B = 0.75
ERROR_SCORE = 1000.0
"""An error line or traceback outranks any question term: what a failing command says."""
MAX_TERMS = 16
"""Question terms searched for, the first and last half of them (a user's question is a few
words; a pasted megabyte leaves 4,000 characters, ~1,000 terms, each of which was one pass over
the text: 800 ms per 100 KB on the event loop)."""
MARK_SPACING = 32
"""At most one blank line or heading per this many characters starts a passage; a text with
more (thousands of one-word paragraphs: a Python step each, 43 ms per 100 KB) is split by its
lines alone, as a log is."""
MARK = "[...skipped chars "
"""How every gap marker starts (`picked` looks for it)."""

_WORD = re.compile(r"[^\W_]+")
_STOP = frozenset(
    """a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is
    it its itself just me more most my myself no nor not now of off on once only or other our
    ours ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself
    yourselves please tell show find get give let make use want need know like also much many
    one com www http https html htm php asp index page fetch search look check read see
    run""".split()
)
_SUFFIXES = ("ations", "ation", "ings", "ing", "ies", "ied", "ers", "er", "es", "ed", "ly", "s")


def terms(question: str) -> list[str]:
    """The question's search stems: lower-cased words, stop words and one-letter words left
    out, common English suffixes taken off (a stem of at least 3 letters is kept), each once,
    in order; of more than `MAX_TERMS`, the first and last half (each costs a pass over the
    text).

    >>> terms("When did Caroline go to the LGBTQ support groups? /wiki/Support_group")
    ['caroline', 'go', 'lgbtq', 'support', 'group', 'wiki']
    """
    found: dict[str, None] = {}
    for word in _WORD.findall(question.lower()):
        if len(word) < 2 or word in _STOP or len(word) > 40:
            continue
        found[_stem(word)] = None
    stems = list(found)
    if len(stems) <= MAX_TERMS:
        return stems
    return stems[: MAX_TERMS // 2] + stems[-(MAX_TERMS // 2) :]


def _stem(word: str) -> str:
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def split(text: str) -> list[int]:
    """Where each passage of `text` starts, and its end last: a blank line ends a passage, a
    heading starts one, lines are grouped up to `MIN_PASSAGE` and a longer line is cut at
    `MAX_PASSAGE` (at a space when there is one). C-level finds, one step per passage, not
    per line: a 100 KB log of short lines is 400 steps, not 8,000.

    >>> text = "# Title\\n\\nFirst paragraph.\\nStill first.\\n\\n## Next\\nBody.\\n"
    >>> bounds = split(text)
    >>> [text[a:b] for a, b in zip(bounds, bounds[1:])]
    ['# Title\\n\\n', 'First paragraph.\\nStill first.\\n\\n', '## Next\\nBody.\\n']
    """
    size = len(text)
    most = size // MARK_SPACING + 64  # found lazily: the search stops one past it
    marks = set(islice((m.end() for m in _BLANK.finditer(text)), most + 1))
    marks.update(islice((m.start() for m in _HEADING.finditer(text)), most + 1 - len(marks)))
    if len(marks) > most:
        marks = set()
    marks.discard(0)
    marks.add(size)
    bounds = [0]
    start = 0
    for stop in sorted(marks):
        while stop - start > MIN_PASSAGE:  # group lines: cut at the first line end past it
            cut = text.find("\n", start + MIN_PASSAGE - 1, stop - 1) + 1
            if cut <= 0 or cut - start > MAX_PASSAGE:
                if stop - start <= MAX_PASSAGE:
                    break
                space = text.rfind(" ", start + MAX_PASSAGE // 2, start + MAX_PASSAGE)
                cut = start + MAX_PASSAGE if space < 0 else space + 1
            bounds.append(cut)
            start = cut
        if stop > start:
            bounds.append(stop)
            start = stop
    return bounds


_BLANK = re.compile(r"\n[ \t\r]*\n(?:[ \t\r]*\n)*")
_HEADING = re.compile(r"^(?:#{1,6} |={3,}|-{3,}|<h[1-6]|SESSION |Session \d)", re.MULTILINE)


def scores(text: str, bounds: Sequence[int], question: str, *, errors: bool) -> list[float]:
    """Each passage's BM25 score against `question` (plus `ERROR_SCORE` for one holding an
    error line or part of a traceback, when `errors`)."""
    count = len(bounds) - 1
    out = [0.0] * count
    stems = terms(question)
    lower = text.lower()
    if len(lower) != len(text):  # U+0130 alone lower-cases to two: offsets would move
        lower = _DOTTED_I.join(piece.lower() for piece in text.split(_DOTTED_I))
    if stems:
        _bm25(lower, bounds, stems, out)
    if errors:
        for at in _error_spots(lower):
            out[_passage_at(bounds, at)] += ERROR_SCORE
    return out


_DOTTED_I = "\u0130"
"""The one character whose lower case is two (`i` and a combining dot); kept as it is (one
join at C speed: a character-by-character pass cost 79 ms per 100 KB)."""


def _bm25(lower: str, bounds: Sequence[int], stems: list[str], out: list[float]) -> None:
    """Add each passage's BM25 score: a term occurs where a word starts with its stem."""
    count = len(out)
    average = len(lower) / count
    for stem in stems:
        if lower.count(stem) * 2 > count:
            continue  # in every other passage or more: it tells none apart, and costs most
        tf: dict[int, int] = {}
        at = lower.find(stem)
        while at >= 0:
            if at == 0 or not lower[at - 1].isalnum():
                passage = _passage_at(bounds, at)
                tf[passage] = tf.get(passage, 0) + 1
            at = lower.find(stem, at + len(stem))
        if not tf:
            continue
        idf = math.log(1 + (count - len(tf) + 0.5) / (len(tf) + 0.5))
        for passage, n in tf.items():
            length = bounds[passage + 1] - bounds[passage]
            out[passage] += idf * n * (K1 + 1) / (n + K1 * (1 - B + B * length / average))


_ERRORS = (
    "error",
    "exception",
    "traceback",
    "failed",
    "failure",
    "fatal",
    "panic",
    "segmentation fault",
    "aborted",
    "denied",
    "not found",
    "cannot ",
    "could not",
    "unable to",
    "\ne   ",
)
"""What marks an error line, lower-cased (`\\ne   `: pytest's failure lines). A substring, not a
word: `TypeError:` is one."""
_EXIT = re.compile(r"exit (?:code|status):? ?[1-9]")
_TRACEBACK = "traceback (most recent call last)"


MAX_SPOTS = 2_048
"""Error spots counted at most: past it every passage that could fit is an error passage
already (7 ms per 100 KB of `error` lines, 67 before), and the rest keeps its order."""


def _error_spots(lower: str) -> list[int]:
    """Offsets of error lines, and of every line of a Python traceback, in lower-cased text."""
    spots = []
    for word in _ERRORS:
        at = lower.find(word)
        while at >= 0:
            spots.append(at + 1 if word[0] == "\n" else at)
            at = lower.find(word, at + len(word))
            if len(spots) > MAX_SPOTS:
                return spots
    spots.extend(m.start() for m in _EXIT.finditer(lower))
    at = lower.find(_TRACEBACK)
    while at >= 0:
        end = lower.find("\n", at)
        while 0 <= end < len(lower) - 1 and lower[end + 1] in " \t":
            spots.append(end + 1)  # the indented frames, up to the exception line
            end = lower.find("\n", end + 1)
            if len(spots) > MAX_SPOTS:
                return spots
        if 0 <= end < len(lower) - 1:
            spots.append(end + 1)
        at = lower.find(_TRACEBACK, at + 1)
    return spots


def _passage_at(bounds: Sequence[int], offset: int) -> int:
    """The passage holding `offset`."""
    return min(bisect_right(bounds, offset) - 1, len(bounds) - 2)


def pick(
    text: str, room: int, question: str, *, how: str, errors: bool = False, tail: bool = False
) -> str | None:
    """`text` cut to at most `room` UTF-16 units: its head, then the passages that score best
    against `question`, in document order, each gap marked
    `[...skipped chars A-B; <how>...]` (`how` says how to get the rest; "" for none).
    `errors`: error lines and tracebacks score first. `tail`: the last passage is kept too
    when it fits (how a command ended). None when there is nothing to pick — no room, no
    question term found outside the head, no error line — and the caller cuts the head as
    before. `text` itself when it fits."""
    size = utf16_len(text)
    if size <= room:
        return text
    if room < MIN_ROOM:
        return None
    bounds = split(text)
    points = scores(text, bounds, question, errors=errors)
    count = len(points)
    lengths = [utf16_len(text[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    widest = utf16_len(_marker(len(text), len(text), how)) + 2
    kept = bytearray(count)
    used = 0
    gaps = 1
    for i in range(count):  # the head: whole passages within its share
        if used + lengths[i] + widest > room * HEAD_SHARE:
            break
        kept[i] = 1
        used += lengths[i]
    if not any(kept):  # a first passage longer than the head's share: nothing to pick by
        return None
    head_end = kept.index(0) if 0 in kept else count
    order = sorted(
        (i for i in range(head_end, count) if points[i] > 0), key=lambda i: (-points[i], i)
    )
    if tail and count - 1 >= head_end and count - 1 not in order:
        order.insert(0, count - 1)
    picked = False
    for i in order:
        more = _more_gaps(kept, i)
        if used + lengths[i] + (gaps + more) * widest <= room:
            kept[i] = 1
            used += lengths[i]
            gaps += more
            picked = True
    if not picked:
        return None
    for i in range(head_end, count):  # what is left extends the head
        if kept[i]:
            continue
        more = _more_gaps(kept, i)
        if used + lengths[i] + (gaps + more) * widest > room:
            break
        kept[i] = 1
        used += lengths[i]
        gaps += more
    out = _render(text, bounds, kept, how)
    return out if utf16_len(out) <= room else utf16_head(out, room)


def _more_gaps(kept: bytearray, i: int) -> int:
    """How the number of gaps changes when passage `i` is kept (the ends count as kept)."""
    left = i == 0 or kept[i - 1]
    right = i == len(kept) - 1 or kept[i + 1]
    return -1 if left and right else (0 if left or right else 1)


def _render(text: str, bounds: Sequence[int], kept: bytearray, how: str) -> str:
    pieces: list[str] = []
    i, count = 0, len(kept)
    while i < count:
        j = i
        while j < count and kept[j] == kept[i]:
            j += 1
        start, end = bounds[i], bounds[j]
        if kept[i]:
            pieces.append(text[start:end])
        else:
            before = "" if not pieces or pieces[-1].endswith("\n") else "\n"
            after = "\n" if j < count else ""
            pieces.append(f"{before}{_marker(start, end, how)}{after}")
        i = j
    return "".join(pieces)


def _marker(start: int, end: int, how: str) -> str:
    return f"{MARK}{start:,}-{end:,}; {how}...]" if how else f"{MARK}{start:,}-{end:,}...]"


def picked(original: str, clamped: str) -> bool:
    """Whether `clamped` was cut by `pick` (it has more gap markers than `original`)."""
    return clamped.count(MARK) > original.count(MARK)
