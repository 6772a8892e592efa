"""Long agent sessions billed like the providers, direct and through ctxbudget, per pruning
policy (issue 22).

Each recorded session in bench/sessions (`bench/record.py`: OpenClaw in three formats, Claude
Code, Codex; 50 requests, 45 tool turns, five tasks) is replayed against the billing stand-in
(`tests/standin.py`: each provider's prompt caching exactly, priced from litellm's map) with
idle gaps between the tasks (`tests/replay.py` `Schedule`: 8 s between a task's requests;
2, 10, 30, then 90 minutes between tasks, on a simulated clock: nothing sleeps):

- direct, as the agent sent it: the bill without ctxbudget;
- through a real `ctxbudget serve` (its own temp paths, its wall clock moved with the
  stand-in's: `tests/simclock.py`) under each policy — caps only (budget on, contextPruning
  off), cache-ttl, pays, pays + summaries.

Besides those idle gaps (`gaps`), two always-warm schedules (issue 31): a request every minute
for the first 40 requests, the cache never going cold — `5m warm` as recorded, and `1h warm`
with every `cache_control` marker at `ttl: "1h"` (OpenClaw's `cacheRetention: "long"`; on the
OpenAI formats `prompt_cache_retention: "24h"`, their longer retention). Beside the policies,
`clear_tool_uses`: Anthropic's server-side context editing with its defaults (above 100,000
input tokens, every tool result but the newest 3 replaced by a placeholder), simulated on
the client's bytes and sent direct to the same stand-in (on the OpenAI formats too, the same
rule over their tool outputs).

Per session and policy it prints the billed cost direct and through the proxy, the saving,
the report's `costUsd` and `withoutCtxbudgetUsd` beside the stand-in's bill (the report must
equal the bill to the token: any token class that differs is named), the results pruned (the
report's segments of kind `pruned`), and two checks on what the stand-in received: no result
among the newest `keepLastAssistants` assistant turns was pruned, and no result was pruned
twice differently (its forwarded bytes, once they differ from caps only, stay the same).
A policy this build's config does not accept runs as caps only, and says so.

    .venv/bin/python bench/pruning.py            # all sessions, all policies (~3 minutes)
    .venv/bin/python bench/pruning.py --quick    # caps only and pays, three sessions
    .venv/bin/python bench/pruning.py --sessions codex --policies "caps only" --json
    .venv/bin/python bench/pruning.py --schedules "1h warm" --policies clear_tool_uses pays
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._shaped import claude_code_shaped  # noqa: E402
from tests.e2e.server import serve  # noqa: E402
from tests.prompt_cache import tokens_of  # noqa: E402
from tests.replay import REPLAY_INDEX, Schedule, Session, recorded, replay  # noqa: E402
from tests.simclock import ClockFile  # noqa: E402
from tests.standin import Received, StandIn, run_standin  # noqa: E402
from tests.workload import WorkingModel  # noqa: E402

PAGES = "http://127.0.0.1:8080"
KEEP_LAST_ASSISTANTS = 3
"""contextPruning's default `keepLastAssistants` (DESIGN.md), which the bench checks."""
POLICIES: dict[str, dict[str, Any]] = {
    "caps only": {"mode": "off"},
    "cache-ttl": {"mode": "cache-ttl"},
    "pays": {"mode": "pays"},
    "pays + summaries": {"mode": "pays", "summarize": {"model": None}},  # the session's model
}
CLEAR_TOOL_USES = "clear_tool_uses"
"""Not a proxy policy: Anthropic's context editing simulated on the client's bytes, direct."""
CLEAR_TRIGGER = 100_000
"""`clear_tool_uses_20250919`'s default trigger, input tokens; `keep`: 3 tool uses."""
CLEAR_KEEP = 3
CLEARED = "[cleared to save context]"
WARM_REQUESTS = 40
SCHEDULES: dict[str, tuple[Schedule, int | None, str | None]] = {
    # name → (when requests are sent, how many, the cache lifetime the markers are set to)
    "gaps": (Schedule(), None, None),
    "5m warm": (Schedule(burst=60.0, gaps=(60.0,)), WARM_REQUESTS, None),
    "1h warm": (Schedule(burst=60.0, gaps=(60.0,)), WARM_REQUESTS, "1h"),
}
WARM_POLICIES = ("caps only", "cache-ttl", "pays")
QUICK_POLICIES = ("caps only", "pays")
QUICK_SESSIONS = ("openclaw-messages", "claude-code", "codex")
TOKEN_CLASSES = (
    # (report usage key, stand-in bill keys)
    ("input", ("input",)),
    ("cacheRead", ("cache_read",)),
    ("cacheWrite", ("cache_write_5m", "cache_write_1h")),
    ("output", ("output",)),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="caps only and pays, 3 sessions")
    parser.add_argument("--sessions", nargs="*", help="recorded sessions to replay (all)")
    parser.add_argument("--policies", nargs="*", choices=[*POLICIES, CLEAR_TOOL_USES], help="(all)")
    parser.add_argument(
        "--schedules", nargs="*", choices=list(SCHEDULES), help="(all; --quick: gaps)"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    names = args.sessions or (QUICK_SESSIONS if args.quick else None)
    sessions = recorded(names) + shaped(names)
    if not sessions:
        sys.exit("no recorded sessions in bench/sessions (bench/record.py makes them)")
    schedules = args.schedules or (["gaps"] if args.quick else list(SCHEDULES))
    started = time.monotonic()
    results: list[Outcome] = []
    for name in schedules:
        schedule, limit, ttl = SCHEDULES[name]
        if args.policies:
            policies = args.policies
        elif args.quick:
            policies = list(QUICK_POLICIES)
        elif name == "gaps":
            policies = [*POLICIES, CLEAR_TOOL_USES]
        else:
            policies = [*WARM_POLICIES, CLEAR_TOOL_USES]
        runs = [warmed(s, name, limit, ttl) for s in sessions]
        results += run(runs, policies, schedule, progress=not args.json)
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=1))
        return
    print_table(results, schedules, time.monotonic() - started)


# --- the schedules' sessions and clear_tool_uses --------------------------------------------


def shaped(names: list[str] | tuple[str, ...] | None) -> list[Session]:
    """The synthesised Claude Code sessions (`bench/_shaped.py`: a prompt every 2 requests,
    ~10 KB results, 10 to 80 requests), those of `names` (all when None)."""
    template = recorded(["claude-code"])
    if not template:
        return []
    found = claude_code_shaped(template[0])
    return [s for s in found if names is None or s.name in names]


def warmed(session: Session, schedule: str, limit: int | None, ttl: str | None) -> Session:
    """`session` as `schedule` replays it: its first `limit` requests, each marker at `ttl`
    (OpenAI bodies: the longer retention); named `session (schedule)` unless `gaps`."""
    meta = dict(session.meta)
    if schedule != "gaps":
        meta["session"] = f"{session.name} ({schedule})"
    if meta.get("synthesised"):
        limit = None  # made as long as it is meant to be: the whole session warm
    requests = session.requests[:limit]
    if ttl is not None:
        requests = [replace(r, body=_longer(r.body, ttl)) for r in requests]
    return Session(meta, requests)


def _longer(body: bytes, ttl: str) -> bytes:
    if not body:
        return body
    data = json.loads(body)
    if not isinstance(data, dict):
        return body
    if "messages" in data and ("system" in data or "max_tokens" in data):

        def mark(value: Any) -> None:
            if isinstance(value, dict):
                control = value.get("cache_control")
                if isinstance(control, dict):
                    control["ttl"] = ttl
                for v in value.values():
                    mark(v)
            elif isinstance(value, list):
                for v in value:
                    mark(v)

        mark(data)
    else:  # OpenAI: no markers; its longer retention
        data["prompt_cache_retention"] = "24h"
    return json.dumps(data, ensure_ascii=False).encode()


def cleared(body: bytes) -> bytes:
    """`body` as Anthropic's `clear_tool_uses_20250919` with its defaults leaves it: when the
    prompt is above `CLEAR_TRIGGER` tokens, every tool result but those of the newest
    `CLEAR_KEEP` tool uses replaced by a placeholder (their inputs kept), oldest first — the
    server decides it again on every request from the client's full history."""
    if not body:
        return body
    data = json.loads(body)
    if not isinstance(data, dict) or tokens_of(body.decode()) < CLEAR_TRIGGER:
        return body
    found: list[tuple[Any, str]] = []  # (container, key) of each tool result, oldest first
    for message in data.get("messages") or []:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "tool":
            found.append((message, "content"))
        elif isinstance(message.get("content"), list):
            found += [
                (b, "content")
                for b in message["content"]
                if isinstance(b, dict) and b.get("type") == "tool_result"
            ]
    items = data.get("input")
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and str(item.get("type", "")).endswith("_call_output"):
            found.append((item, "output"))
    for holder, key in found[: max(0, len(found) - CLEAR_KEEP)]:
        holder[key] = CLEARED
    return json.dumps(data, ensure_ascii=False).encode()


# --- one replay -----------------------------------------------------------------------------


@dataclass
class Outcome:
    """One session replayed one way: direct, or through the proxy under a policy."""

    session: str
    model: str
    policy: str
    """"direct", or a key of POLICIES."""
    requests: int
    bill: dict[str, Any]
    """The stand-in's `bill()` without its lines."""
    applied: str = ""
    """What the proxy ran: the policy, or why it ran as caps only."""
    report: dict[str, Any] = field(default_factory=dict)
    """The report's `totals.money`."""
    pruned: int = 0
    """Segments of kind `pruned` in the report's records."""
    busts: int = 0
    errors: list[str] = field(default_factory=list)
    results: list[dict[str, str]] = field(default_factory=list)
    """Per request: call id → digest of the tool result as the stand-in received it."""
    protected: list[set[str]] = field(default_factory=list)
    """Per request: the call ids of its newest `keepLastAssistants` assistant turns."""
    checks: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "model": self.model,
            "policy": self.policy,
            "applied": self.applied,
            "requests": self.requests,
            "bill": self.bill,
            "report": self.report,
            "pruned": self.pruned,
            "busts": self.busts,
            "checks": self.checks,
            "errors": self.errors,
        }


def run(
    sessions: list[Session], policies: list[str], schedule: Schedule, *, progress: bool
) -> list[Outcome]:
    """Every session direct and under each policy: their outcomes, checked."""
    out: list[Outcome] = []
    with run_standin() as standin:
        for session in sessions:
            direct = replay_direct(standin, session, schedule)
            out.append(direct)
            baseline: Outcome | None = None
            for policy in policies:
                if policy == CLEAR_TOOL_USES:
                    outcome = replay_direct(standin, session, schedule, cleared)
                    check(outcome, None)
                    out.append(outcome)
                    if progress:
                        print(f"  replayed {session.name} × {policy}", file=sys.stderr, flush=True)
                    continue
                outcome = replay_proxied(standin, session, schedule, policy)
                if policy == "caps only":
                    baseline = outcome
                check(outcome, baseline)
                out.append(outcome)
                if progress:
                    print(f"  replayed {session.name} × {policy}", file=sys.stderr, flush=True)
    return out


def _fresh(standin: StandIn) -> None:
    standin.reset()
    standin.planner = WorkingModel("/home/agent/work", PAGES)


def replay_direct(
    standin: StandIn, session: Session, schedule: Schedule, edit: Any = None
) -> Outcome:
    """`session` sent straight to the stand-in; with `edit`, each body as it rewrites it (the
    provider's own context editing: `cleared`)."""
    _fresh(standin)
    if edit is not None:
        session = Session(session.meta, [replace(r, body=edit(r.body)) for r in session.requests])
    replies = replay(session, standin.root, standin.clock.advance, schedule)
    policy = "direct" if edit is None else CLEAR_TOOL_USES
    outcome = Outcome(session.name, session.model, policy, len(replies), _bill(standin))
    outcome.applied = policy
    outcome.errors = [f"request {i}: {r.status}" for i, r in enumerate(replies) if r.status >= 400]
    _read_results(outcome, standin.received)
    return outcome


def replay_proxied(standin: StandIn, session: Session, schedule: Schedule, policy: str) -> Outcome:
    _fresh(standin)
    pruning, applied = policy_config(policy, session.model)
    with tempfile.TemporaryDirectory(prefix="ctxbudget-pruning-") as tmp:
        clock = ClockFile(Path(tmp) / "clock")
        with serve(Path(tmp), _config(Path(tmp), standin, pruning), clock=clock.path) as proxy:

            def advance(seconds: float) -> None:
                standin.clock.advance(seconds)
                clock.advance(seconds)

            replies = replay(session, proxy.root, advance, schedule)
            report = httpx.get(f"{proxy.root}/context/budget", timeout=60).json()
    outcome = Outcome(session.name, session.model, policy, len(replies), _bill(standin))
    outcome.applied = applied
    outcome.errors = [f"request {i}: {r.status}" for i, r in enumerate(replies) if r.status >= 400]
    outcome.report = report["totals"]["money"]
    records = report["recent"]
    if len(records) < len(replies):
        outcome.errors.append(f"the report lists {len(records)} of {len(replies)} requests")
    segments = [s for r in records for s in r.get("segments") or []]
    outcome.pruned = sum(1 for s in segments if s.get("kind") == "pruned")
    outcome.busts = sum(1 for r in records if r.get("cacheBust"))
    _read_results(outcome, standin.received)
    return outcome


def policy_config(policy: str, model: str) -> tuple[dict[str, Any] | None, str]:
    """`agents.defaults.contextPruning` for `policy`, and what will run: the policy, or caps
    only when this build's config refuses the policy's keys (pruning not built yet)."""
    wanted = POLICIES[policy]
    if "summarize" in wanted:
        wanted = {**wanted, "summarize": {"model": model}}
    if _accepts(wanted):
        return wanted, policy
    return None, "caps only"  # without contextPruning: the budget's caps, nothing pruned


def _accepts(pruning: dict[str, Any]) -> bool:
    from pydantic import ValidationError

    from ctxbudget.proxy.config.schema import Config

    try:
        Config.model_validate({"agents": {"defaults": {"contextPruning": pruning}}})
    except ValidationError:
        return False
    return True


def _config(tmp: Path, standin: StandIn, pruning: dict[str, Any] | None) -> dict[str, Any]:
    defaults: dict[str, Any] = {"contextBudget": {"enabled": True}}
    if pruning is not None:
        defaults["contextPruning"] = pruning
    return {
        "proxy": {
            "upstream": {"baseUrl": standin.base_url, "apiKeyEnv": None, "readTimeoutSeconds": 120},
            "anthropic": {"baseUrl": standin.root, "apiKeyEnv": None},
        },
        "agents": {"defaults": defaults},
        "report": {"path": str(tmp / "report.db"), "recentRequests": 1000},
        "memory": {"store": {"path": str(tmp / "memory.db")}},
    }


def _bill(standin: StandIn) -> dict[str, Any]:
    bill = standin.bill()
    bill.pop("lines")
    return bill


# --- what the stand-in received: tool results per call id -----------------------------------


def _read_results(outcome: Outcome, received: list[Received]) -> None:
    """The tool results of each replayed request as the stand-in received it (a request the
    proxy made of its own, a summary's, carries no `REPLAY_INDEX`)."""
    replayed = sorted(
        (int(r.headers[REPLAY_INDEX]), r) for r in received if REPLAY_INDEX in r.headers
    )
    for _, r in replayed:
        data = r.json
        if not isinstance(data, dict):
            continue
        wire = {"/v1/chat/completions": "chat", "/v1/messages": "messages"}.get(r.path)
        results, turns = tool_results(wire or "responses", data)
        outcome.results.append(results)
        outcome.protected.append({c for turn in turns[-KEEP_LAST_ASSISTANTS:] for c in turn})


def tool_results(wire: str, data: dict[str, Any]) -> tuple[dict[str, str], list[list[str]]]:
    """(call id → digest of its result as sent, the call ids of each assistant turn in order)
    of one request body."""
    results: dict[str, str] = {}
    turns: list[list[str]] = []
    if wire == "responses":
        given = data.get("input")
        items: list[Any] = given if isinstance(given, list) else []
        in_turn = False
        for item in items:
            if not isinstance(item, dict):
                continue
            kind = str(item.get("type", ""))
            model_item = kind in ("reasoning", "function_call", "custom_tool_call") or (
                item.get("role") == "assistant"
            )
            if model_item and not in_turn:
                turns.append([])
            in_turn = model_item
            if kind in ("function_call", "custom_tool_call"):
                turns[-1].append(str(item.get("call_id")))
            elif kind.endswith("_call_output"):
                results[str(item.get("call_id"))] = _digest(item.get("output"))
        return results, turns
    for message in data.get("messages") or []:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if message.get("role") == "assistant":
            calls = [str(c.get("id")) for c in message.get("tool_calls") or []]
            if isinstance(content, list):
                calls += [
                    str(b.get("id"))
                    for b in content
                    if isinstance(b, dict) and b.get("type") == "tool_use"
                ]
            turns.append(calls)
        elif message.get("role") == "tool":
            results[str(message.get("tool_call_id"))] = _digest(content)
        elif isinstance(content, list):
            for b in content:
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    results[str(b.get("tool_use_id"))] = _digest(b.get("content"))
    return results, turns


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def check(outcome: Outcome, baseline: Outcome | None) -> None:
    """Prunes seen in what the stand-in received, against caps only: none among the newest
    `keepLastAssistants` turns, none that changed again later; and the report against the
    bill, token class by token class."""
    checks: dict[str, Any] = {}
    if baseline is not None and baseline is not outcome:
        changed_recent = 0
        flips = 0
        first: dict[str, str] = {}
        for i, (now, before) in enumerate(zip(outcome.results, baseline.results, strict=False)):
            for call, digest in now.items():
                differs = before.get(call) != digest
                if differs and call in outcome.protected[i]:
                    changed_recent += 1
                if call in first and first[call] != digest:
                    flips += 1
                if differs and call not in first:
                    first[call] = digest
        checks["prunedSeen"] = len(first)
        checks["prunedInNewestTurns"] = changed_recent
        checks["prunedTwiceDifferently"] = flips
    checks["reportEqualsBill"] = _against_bill(outcome)
    outcome.checks = checks


def _against_bill(outcome: Outcome) -> list[str]:
    """The token classes and money where the report differs from the bill (empty: equal)."""
    if not outcome.report:
        return []
    tokens = outcome.bill["tokens"]
    usage = outcome.report.get("usage") or {}
    out = []
    for key, classes in TOKEN_CLASSES:
        billed = sum(tokens[c] for c in classes)
        if usage.get(key) != billed:
            out.append(f"{key} {usage.get(key)} vs {billed}")
    cost, billed_usd = outcome.report.get("costUsd"), outcome.bill["usd"]
    if cost is None or billed_usd is None or abs(cost - billed_usd) > 1e-9 * max(1.0, billed_usd):
        out.append(f"costUsd {cost} vs ${billed_usd}")
    return out


# --- the table ------------------------------------------------------------------------------


def print_table(results: list[Outcome], schedules: list[str], took: float) -> None:
    for name in schedules:
        schedule, limit, ttl = SCHEDULES[name]
        head = f"{name}: {schedule.describe()}"
        if limit is not None:
            head += f"; the first {limit} requests"
        if ttl is not None:
            head += f'; markers at ttl "{ttl}" (OpenAI: prompt_cache_retention "24h")'
        print(f"{head}; keepLastAssistants {KEEP_LAST_ASSISTANTS}")
        suffix = "" if name == "gaps" else f" ({name})"
        rows = [r for r in results if r.session.endswith(suffix) and (
            name != "gaps" or not r.session.endswith(")"))]  # fmt: skip
        _print_rows(rows)
        _print_totals(rows)
        print()
    stand_ins = sorted(
        {r.policy for r in results if r.policy != "direct" and r.applied != r.policy}
    )
    if stand_ins:
        print(
            f"* {', '.join(stand_ins)}: ran as caps only — this build's config has no "
            "agents.defaults.contextPruning (issue 22 items 1-5)"
        )
    print(f"({took:.0f} s)")


def _print_rows(results: list[Outcome]) -> None:
    print(
        f"{'session':27} {'model':17} {'policy':17} {'direct':>9} {'proxied':>9} {'saved':>7} "
        f"{'report costUsd':>15} {'without':>9} {'pruned':>6}  checks"
    )
    direct: dict[str, Outcome] = {}
    for r in results:
        if r.policy == "direct":
            direct[r.session] = r
            continue
        d = direct[r.session]
        base, cost = d.bill["usd"], r.bill["usd"]
        saved = (base - cost) / base if base else 0.0
        report_cost = r.report.get("costUsd")
        without = r.report.get("withoutCtxbudgetUsd")
        policy = r.policy + ("*" if r.applied != r.policy else "")
        print(
            f"{r.session:27} {r.model:17} {policy:17} ${base:8.4f} ${cost:8.4f} {saved:6.1%} "
            f"{_usd(report_cost):>15} {_usd(without):>9} {r.pruned:6}  {_checks(r, d)}"
        )


def _print_totals(results: list[Outcome]) -> None:
    """Per policy over the schedule's sessions: the saving on their summed bills, the worst
    session, and the report's `withoutCtxbudgetUsd` against the direct bills."""
    direct = {r.session: r.bill["usd"] for r in results if r.policy == "direct"}
    policies = list(dict.fromkeys(r.policy for r in results if r.policy != "direct"))
    for policy in policies:
        rows = [r for r in results if r.policy == policy]
        base = sum(direct[r.session] for r in rows)
        cost = sum(r.bill["usd"] for r in rows)
        worst = min((direct[r.session] - r.bill["usd"]) / direct[r.session] for r in rows)
        line = f"  all sessions × {policy:17} saved {(base - cost) / base:6.1%}, worst {worst:6.1%}"
        withouts = [r.report.get("withoutCtxbudgetUsd") for r in rows]
        if all(w is not None for w in withouts):
            off = max(abs(w / direct[r.session] - 1) for w, r in zip(withouts, rows, strict=True))
            line += f"; withoutCtxbudgetUsd off direct by at most {off:.1%}"
        print(line)


def _usd(value: float | None) -> str:
    return "-" if value is None else f"${value:.4f}"


def _checks(r: Outcome, direct: Outcome) -> str:
    parts = []
    diff = r.checks.get("reportEqualsBill", [])
    if r.report:  # clear_tool_uses went direct: no report
        parts.append("report = bill" if not diff else "report ≠ bill: " + "; ".join(diff))
    without = r.report.get("withoutCtxbudgetUsd")
    base = direct.bill["usd"]
    if without is not None and base:
        parts.append(f"without/direct {without / base - 1:+.1%}")
    if "prunedInNewestTurns" in r.checks:
        parts.append(
            f"newest {KEEP_LAST_ASSISTANTS} turns pruned: {r.checks['prunedInNewestTurns']}, "
            f"pruned twice differently: {r.checks['prunedTwiceDifferently']}"
        )
    if r.errors or direct.errors:
        parts.append("errors: " + ", ".join((direct.errors + r.errors)[:3]))
    return "; ".join(parts)


if __name__ == "__main__":
    main()
