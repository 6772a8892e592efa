"""The README's examples as a new user runs them (issue 36): copied from README.md as
written, against the real proxy, with nothing set up beforehand — so the README cannot drift
from what works again."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.e2e.server import serve, standin_config
from tests.standin import StandIn

README = Path(__file__).resolve().parents[2] / "README.md"
README_ROOT = "http://127.0.0.1:4141"
"""The proxy's address in the README's examples: the test's proxy listens elsewhere."""


def readme_block(language: str, containing: str) -> str:
    """The README's fenced `language` block that contains `containing`."""
    blocks = re.findall(rf"```{language}\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    found = [b for b in blocks if containing in b]
    assert len(found) == 1, f"one ```{language} block with {containing!r} in README.md"
    return found[0]


def test_the_readme_sdk_snippet_runs_as_written_without_keys(
    tmp_path: Path, standin: StandIn
) -> None:
    snippet = readme_block("python", "from openai import OpenAI")
    assert README_ROOT in snippet
    with serve(tmp_path, standin_config(tmp_path, standin)) as server:
        env = {
            k: v
            for k, v in os.environ.items()
            # a new user's shell: no provider key, no SDK settings of an earlier session
            if not k.startswith(("OPENAI_", "ANTHROPIC_", "CTXBUDGET"))
        }
        run = subprocess.run(
            [sys.executable, "-c", snippet.replace(README_ROOT, server.root)],
            env={**env, "HOME": str(tmp_path)},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        report = server.report()
    # each of the snippet's three calls went through the proxy and was answered
    assert report["totals"]["requests"] == 3, report["totals"]
    assert sorted(r["wire"] for r in report["recent"]) == ["chat", "messages", "responses"]
    assert {r["status"] for r in report["recent"]} == {200}
