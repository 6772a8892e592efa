"""The request's phase marks (`proxy/pipeline/marks.py`): what telemetry's spans, the metrics'
histograms and bench/stages.py read from each record."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from ctxbudget.proxy.pipeline.marks import timed
from ctxbudget.proxy.report import RequestRecord
from tests.inproc import proxy_app, state_of

PHASES = ("start", "parsed", "clamped", "recall_start", "recall_end", "upstream_start", "end")
"""Every mark a proxied request's record carries, in the order they are taken."""


class Kept:
    """A report sink keeping each record's marks."""

    def __init__(self) -> None:
        self.marks: list[dict[str, int]] = []

    def record(self, r: RequestRecord, body: dict[str, Any]) -> None:
        self.marks.append(dict(r.marks))


CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "claude-sonnet-4-5", "max_tokens": 5, **CHAT}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", CHAT),
        ("/v1/chat/completions", {**CHAT, "stream": True}),
        ("/v1/messages", MESSAGES),
        ("/v1/responses", {"model": "gpt-4o", "input": "hi"}),
    ],
)
def test_every_proxied_request_records_each_phase_in_order(
    tmp_path: Path, path: str, body: dict[str, Any]
) -> None:
    kept = Kept()
    with proxy_app(tmp_path) as (client, fake):
        state_of(client).reports.sinks.append(kept)
        if body.get("stream"):
            fake.answer_sse([b'data: {"choices": []}\n\n', b"data: [DONE]\n\n"])
        assert client.post(path, json=body).status_code == 200
        client.settle()
    [marks] = kept.marks
    assert tuple(marks) == PHASES  # taken in this order, each once
    assert [marks[p] for p in PHASES] == sorted(marks[p] for p in PHASES)


def test_a_phase_is_marked_on_entry_and_on_a_clean_exit_only() -> None:
    marks: dict[str, int] = {}
    with timed(marks, "recall_start", "recall_end"):
        assert list(marks) == ["recall_start"]
    assert list(marks) == ["recall_start", "recall_end"]
    assert marks["recall_start"] <= marks["recall_end"]
    with pytest.raises(ValueError), timed(marks, "upstream_start", "end"):
        raise ValueError("the upstream refused")
    assert "end" not in marks  # no span claims a phase that raised finished
    with timed(marks, end="clamped"):  # it began where the last phase ended
        pass
    assert marks["clamped"] >= marks["recall_end"]


def test_the_stages_mark_their_phases_only_through_timed() -> None:
    """One way to mark a phase, so a stage reads as what it does: no clock read and no
    write into `marks` inline."""
    import ctxbudget.proxy.pipeline.stages

    tree = ast.parse(Path(ctxbudget.proxy.pipeline.stages.__file__).read_text())
    inline = [
        f"line {node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("time_ns"))
        or (
            isinstance(node, ast.Assign | ast.AugAssign)
            and any(
                isinstance(target, ast.Subscript) and ast.unparse(target.value).endswith("marks")
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            )
        )
    ]
    assert inline == []
