"""What the session stage costs on the request path, in-process, per wire format.

For the last captured request of each format (../shared/fixtures), the median over many
rounds of: parse + user turn + clamp (what the request path did before sessions), and the
session stage added by issue 11 (hash the blocks as sent, name the session, look up the
memory blocks to place again, compare with the session's previous request).

    .venv/bin/python bench/sessions.py [--rounds 500]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ctxbudget.caps import Memo, clamp_request, remembering  # noqa: E402
from ctxbudget.proxy.cache.prefix import ClientPrefix  # noqa: E402
from ctxbudget.proxy.cache.sessions import SessionTracker, session_key  # noqa: E402
from ctxbudget.proxy.config.schema import Config  # noqa: E402
from ctxbudget.proxy.config.settings import settings_for  # noqa: E402
from ctxbudget.proxy.wire import AnthropicMessages, ChatCompletions, OpenAIResponses  # noqa: E402
from tests.openclaw import format_fixtures  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=500)
    args = parser.parse_args()
    config = Config.model_validate({"agents": {"defaults": {"contextBudget": {"enabled": True}}}})
    settings = settings_for(config, {})
    print(f"{'format':<20} {'size':>7} {'parse+clamp':>12} {'session stage':>14}")
    for name, wire, folder in (
        ("chat completions", ChatCompletions(), "openclaw"),
        ("Anthropic Messages", AnthropicMessages(), "openclaw-messages"),
        ("OpenAI Responses", OpenAIResponses(), "openclaw-responses"),
    ):
        found = format_fixtures(folder)
        if not found:
            print(f"{name:<20} (no captures in ../shared/fixtures/{folder})")
            continue
        raw = found[-1][1]
        tracker = SessionTracker()
        clamp = remembering(clamp_request, Memo())  # as an app's: what it made is found again
        before, stage = [], []
        for i in range(args.rounds + 20):
            t0 = time.perf_counter()
            body = wire.parse(raw)
            body.user_turn()
            body.clamp(clamp, settings.caps, settings.tool_names, apply=True)
            t1 = time.perf_counter()
            prefix = ClientPrefix(body.blocks())
            session = session_key({}, body.get, body.model, prefix)
            tracker.placed_memory("o", session, prefix)
            tracker.observe("o", session, prefix, body.blocks(), memory={})
            t2 = time.perf_counter()
            if i >= 20:  # warm: caches filled as on an agent's later turns
                before.append(t1 - t0)
                stage.append(t2 - t1)
        print(
            f"{name:<20} {len(raw) / 1000:>5.0f}KB {statistics.median(before) * 1000:>9.3f} ms"
            f" {statistics.median(stage) * 1000:>11.3f} ms"
        )


if __name__ == "__main__":
    main()
