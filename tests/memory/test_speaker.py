from __future__ import annotations

import dataclasses
import doctest

from ctxbudget.memory import MemoryLimits, NewMemory, speaker
from ctxbudget.memory.profiles import PROFILES, RetrievalProfileName
from ctxbudget.memory.selection import Selection, select_memories
from ctxbudget.memory.speaker import named, points
from tests.conftest import Backend
from tests.memory.memories import NOW, memory


def test_the_docstring_examples_hold() -> None:
    assert doctest.testmod(speaker).failed == 0


def test_a_speaker_is_a_capitalised_label_before_a_colon_at_the_start() -> None:
    assert speaker.speaker("Melanie: hi") == "melanie"
    assert speaker.speaker("[6:55 pm on 20 October, 2023] Jon: the studio opened") == "jon"
    assert speaker.speaker("[20 Oct]Maria Lopez: hi") == "maria lopez"
    assert speaker.speaker("Coffee: oat milk flat white") == "coffee"  # a topic label counts
    # not a label: lower case, no space after the colon, a colon later on, four words
    assert speaker.speaker("melanie: hi") is None
    assert speaker.speaker("Meeting at 10:30 with Bob") is None
    assert speaker.speaker("See https://example.com") is None
    assert speaker.speaker("Deploys happen: on Tuesdays") is None
    assert speaker.speaker("One Two Three Four: too long for a name") is None
    assert speaker.speaker("") is None


def test_any_word_of_the_label_names_it_but_a_stopword_does_not() -> None:
    assert named({"what", "did", "maria", "say"}, "Maria Lopez: hi")
    assert named({"lopez"}, "Maria Lopez: hi")
    assert not named({"the"}, "The Team: standup moved to 10")
    assert named({"team"}, "The Team: standup moved to 10")
    assert not named({"maria"}, "Jon: Maria says hi")  # said to or about Maria, not by her


def test_points_go_only_to_the_named_speakers_memories_and_only_when_on() -> None:
    memories = [memory(1, "Melanie: hi"), memory(2, "Caroline: hi Melanie"), memory(3, "x")]
    assert points(["melanie"], memories, 25.0) == {1: 25.0}
    assert points(["melanie"], iter(memories), 25.0) == {1: 25.0}  # any iterable, once
    assert points(["melanie"], memories, 0.0) == {}
    assert points([], memories, 25.0) == {}


def _conversation(backend: Backend) -> None:
    store = backend.open(clock=lambda: NOW - 86_400)
    # memories added one at a time: no conversation context between them
    for text in (
        "[8 May, 2023] Caroline: Thanks, Melanie! Running with you was great fun",
        "[8 May, 2023] Caroline: Melanie, do you still go running to destress?",
        "[9 May, 2023] Melanie: I go running to clear my head after work",
        *(f"[{d} May, 2023] Caroline: note {d} about the council meeting" for d in range(10, 30)),
    ):
        store.add(NewMemory(owner="default", text=text))


def _recall(
    backend: Backend, name: RetrievalProfileName, *, speaker_points: float | None = None
) -> Selection:
    profile = PROFILES[name]
    if speaker_points is not None:
        profile = dataclasses.replace(profile, speaker=speaker_points)
    return select_memories(
        backend.opened[-1],
        "default",
        "what does Melanie do to destress running",
        profile,
        "",
        limits=MemoryLimits(),
        now=NOW,
        max_chars=10_000,
        count_tokens=len,
    )


def test_deep_puts_what_the_named_speaker_said_first_and_says_so(backend: Backend) -> None:
    _conversation(backend)
    hers = "[9 May, 2023] Melanie: I go running to clear my head after work"
    without = _recall(backend, "deep", speaker_points=0.0)
    assert without.chosen[0].memory.text != hers  # the turns addressed to her match better
    deep = _recall(backend, "deep")
    assert deep.chosen[0].memory.text == hers
    signals = deep.chosen[0].signals()
    assert signals["speaker"] == speaker.POINTS
    assert signals["score"] == round(deep.chosen[0].score, 3)
    assert all(c.speaker == 0 for c in deep.chosen[1:])
    # same query, same memories: the same memories, order and signals
    again = _recall(backend, "deep")
    assert [c.signals() for c in again.chosen] == [c.signals() for c in deep.chosen]
    assert [c.memory.id for c in again.chosen] == [c.memory.id for c in deep.chosen]
    # lean and balanced do not use it
    assert all(c.speaker == 0 for c in _recall(backend, "lean").candidates)
    assert all(c.speaker == 0 for c in _recall(backend, "balanced").candidates)
