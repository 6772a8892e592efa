"""Record long real-agent sessions for the pruning bench (`bench/pruning.py`).

Each agent — OpenClaw in its three wire formats, Claude Code, Codex — works through five
coding tasks over a copy of the `json5` package (`tests/workload.py`), driven by the stand-in
playing a working model: 45 tool turns (reads, commands, greps, fetches of local pages, edits,
a new file) and an answer per task, each task a new invocation of the agent in the same
session, as a user comes back to it. Every request the agent sends is recorded — headers and
body, exactly — into `bench/sessions/<agent>.jsonl.xz` (`tests/replay.py`), with machine paths
rewritten. Offline: the agents talk only to 127.0.0.1, with made-up keys.

    .venv/bin/python bench/record.py                 # all five (~5 minutes)
    .venv/bin/python bench/record.py claude-code     # one

Needs the agents (`scripts/agents`). Prints, per agent, the requests and tool turns recorded,
the time taken and the file's size.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.processes import run_agent  # noqa: E402
from tests.replay import MACHINE, SESSIONS, WORKSPACE, Recorded, Session, save  # noqa: E402
from tests.standin import Received, StandIn, run_standin  # noqa: E402
from tests.workload import (  # noqa: E402
    TASKS,
    DocsPages,
    WorkingModel,
    build_workspace,
    prompts,
    task_of,
    tool_turns,
)

MODEL_ROUTES = ("/v1/chat/completions", "/v1/messages", "/v1/responses")
PAGES = "http://127.0.0.1:8080"
"""Where the docs pages appear to be in a recording."""
STANDIN = "http://127.0.0.1:4141"
OPENCLAW_FORMATS = {
    # session name → (OpenClaw's api, wire format, model, the route it posts to)
    "openclaw-chat": ("openai-completions", "chat", "gpt-4.1", "/v1/chat/completions"),
    "openclaw-messages": ("anthropic-messages", "messages", "claude-sonnet-4-5", "/v1/messages"),
    "openclaw-responses": ("openai-responses", "responses", "gpt-5.5", "/v1/responses"),
}
AGENTS = (*OPENCLAW_FORMATS, "claude-code", "codex")
TIMEOUT = 900


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("agents", nargs="*", help=f"some of {', '.join(AGENTS)} (all)")
    parser.add_argument("--out", type=Path, default=SESSIONS)
    args = parser.parse_args()
    unknown = set(args.agents) - set(AGENTS)
    if unknown:
        parser.error(f"unknown agents {sorted(unknown)}: choose from {', '.join(AGENTS)}")
    paths = _agents()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.agents or AGENTS:
        started = time.monotonic()
        session, notes = record(name, paths)
        size = save(args.out / f"{name}.jsonl.xz", session)
        took = time.monotonic() - started
        print(
            f"{name:19} {len(session.requests):3} requests, {session.meta['toolTurns']:3} tool "
            f"turns in {took:5.0f} s, {size / 1e6:.2f} MB{'; ' + notes if notes else ''}",
            flush=True,
        )


def record(name: str, paths: dict[str, str]) -> tuple[Session, str]:
    """Run agent `name` through the five tasks; its session, and what went differently."""
    with tempfile.TemporaryDirectory(prefix="ctxbudget-record-") as tmp:
        base = Path(tmp)
        work, home = base / "work", base / "home"
        home.mkdir()
        build_workspace(work, claude=name == "claude-code")
        docs = DocsPages()
        with docs.serving() as pages, run_standin() as standin:
            standin.planner = WorkingModel(str(work), pages)
            run = _runner(name, paths, base, work, home, standin)
            failures = []
            for n, prompt in enumerate(prompts(pages), start=1):
                done = run(prompt, n)
                if done.returncode != 0:
                    failures.append(f"task {n} exited {done.returncode}: {done.stderr[-300:]!r}")
            received = [r for r in standin.received if r.path in MODEL_ROUTES]
        rewrites = [
            (str(work), WORKSPACE),
            (str(work).replace("/", "-"), WORKSPACE.replace("/", "-")),  # Claude Code's projects
            (str(home), "/home/agent"),
            (str(base), "/home/agent/run"),
            (pages, PAGES),
            (standin.root, STANDIN),
            (f"127.0.0.1:{standin.port}", STANDIN.removeprefix("http://")),
            (str(Path(paths["OPENCLAW"]).parents[1]), "/opt/agents"),
            ("/tmp/", "/home/agent/run/tmp/"),  # OpenClaw's spill files (web_fetch's full text)
        ]
        requests = [_rewritten(r, rewrites) for r in received]
    leftovers = sorted({m for r in requests for m in _machine_paths(r)})
    turns = sum(_new_results(r) for r in requests)
    meta = {
        "session": name,
        "agent": name.split("-")[0] if name.startswith("openclaw") else name,
        "format": _format(requests[0].path) if requests else None,
        "route": requests[0].path if requests else None,
        "model": (requests[0].json or {}).get("model") if requests else None,
        "recorded": datetime.date.today().isoformat(),
        "versions": _versions(),
        "tasks": len(TASKS),
        "toolTurns": turns,
        "scriptedToolTurns": tool_turns(),
        "requests": len(requests),
        "workspace": WORKSPACE,
        "pages": PAGES,
    }
    notes = "; ".join(failures + ([f"machine paths left: {leftovers}"] if leftovers else []))
    if notes:
        meta["notes"] = notes
    return Session(meta, requests), notes


Runner = Callable[[str, int], subprocess.CompletedProcess[str]]


def _runner(
    name: str, paths: dict[str, str], base: Path, work: Path, home: Path, standin: StandIn
) -> Runner:
    env = {"PATH": f"{Path(paths['NODE26']).parent}:/usr/bin:/bin", "HOME": str(home)}
    env["TERM"] = "dumb"
    if name in OPENCLAW_FORMATS:
        api, wire, model, _ = OPENCLAW_FORMATS[name]
        base_url = standin.root if wire == "messages" else standin.base_url
        provider = {
            "api": api,
            "baseUrl": base_url,
            "apiKey": "sk-bench",
            "models": [
                {
                    "id": model,
                    "name": model,
                    "reasoning": False,
                    "input": ["text"],
                    "contextWindow": 400_000,
                    "maxTokens": 8192,
                }
            ],
        }
        fetch = {"ssrfPolicy": {"dangerouslyAllowPrivateNetwork": True}}  # the pages are local
        config = {
            "agents": {"defaults": {"workspace": str(work), "model": {"primary": f"p/{model}"}}},
            "models": {"mode": "merge", "providers": {"p": provider}},
            "tools": {"web": {"fetch": fetch}},
            "memory": {"search": {"provider": "none"}},
        }
        (base / "openclaw.json").write_text(json.dumps(config))
        env |= {
            "OPENCLAW_CONFIG_PATH": str(base / "openclaw.json"),
            "OPENCLAW_STATE_DIR": str(base / "state"),
            "OPENCLAW_NO_AUTO_UPDATE": "1",
            "OPENCLAW_TELEMETRY": "0",
            "DO_NOT_TRACK": "1",
        }

        def openclaw(prompt: str, n: int) -> subprocess.CompletedProcess[str]:
            argv = [paths["OPENCLAW"], "agent", "--local", "--agent", "main"]
            argv += ["--session-key", "bench", "--message", prompt, "--json"]
            return _run(argv, env, base)

        return openclaw
    if name == "claude-code":
        env |= {
            "ANTHROPIC_BASE_URL": standin.root,
            "ANTHROPIC_API_KEY": "sk-bench",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "IS_SANDBOX": "1",  # lets --dangerously-skip-permissions run as root
        }
        session = str(uuid.uuid4())

        def claude(prompt: str, n: int) -> subprocess.CompletedProcess[str]:
            argv = [paths["CLAUDE"], "-p", prompt, "--output-format", "json"]
            argv += ["--dangerously-skip-permissions"]
            argv += ["--session-id", session] if n == 1 else ["--resume", session]
            return _run(argv, env, work)

        return claude
    codex_home = home / ".codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        "check_for_update_on_startup = false\n"
        'model = "gpt-5.5"\n'
        'model_provider = "bench"\n'
        'sandbox_mode = "danger-full-access"\n'
        'approval_policy = "never"\n\n'
        "[model_providers.bench]\n"
        'name = "bench"\n'
        f'base_url = "{standin.base_url}"\n'
        'wire_api = "responses"\n'
        'env_key = "BENCH_API_KEY"\n\n'
        "[analytics]\nenabled = false\n\n"
        "[feedback]\nenabled = false\n"
    )
    env |= {"CODEX_HOME": str(codex_home), "BENCH_API_KEY": "sk-bench"}

    def codex(prompt: str, n: int) -> subprocess.CompletedProcess[str]:
        argv = [paths["CODEX"], "exec", "--skip-git-repo-check"]
        argv += [prompt] if n == 1 else ["resume", "--last", prompt]
        return _run(argv, env, work)

    return codex


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    done, late = run_agent(argv, env=env, cwd=cwd, timeout=TIMEOUT)
    if late:
        done.stderr += f"\n(killed after {TIMEOUT} s)"
    return done


def _rewritten(r: Received, rewrites: list[tuple[str, str]]) -> Recorded:
    def fix(text: str) -> str:
        for old, new in rewrites:
            text = text.replace(old, new)
        return text

    body = fix(r.body.decode())
    headers = {k: fix(v) for k, v in r.headers.items() if k not in ("host", "content-length")}
    data = json.loads(body) if body else {}
    wire = _format(r.path)
    return Recorded(task_of(wire, data), r.method, r.path, r.query, headers, body.encode())


def _machine_paths(r: Recorded) -> set[str]:
    """Paths of this machine still in a request (none should be left)."""
    return set(MACHINE.findall(r.body.decode() + json.dumps(r.headers)))


def _new_results(r: Recorded) -> int:
    """1 when the request's newest turn carries a tool result (a tool turn came back)."""
    data = r.json or {}
    wire = _format(r.path)
    items = data.get("messages") if wire != "responses" else data.get("input")
    if not isinstance(items, list):
        return 0
    for item in reversed(items):
        if not isinstance(item, dict):
            continue
        if wire == "responses":
            if str(item.get("type", "")).endswith("_call_output"):
                return 1
            if item.get("type") in ("function_call", "custom_tool_call"):
                return 0
            if item.get("role") == "assistant":
                return 0
            continue
        if item.get("role") == "tool":
            return 1
        content = item.get("content")
        if item.get("role") == "user" and isinstance(content, list):
            if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
                return 1
        if item.get("role") == "assistant":
            return 0
    return 0


def _format(path: str) -> str:
    return {"/v1/chat/completions": "chat", "/v1/messages": "messages"}.get(path, "responses")


def _versions() -> dict[str, str]:
    out = {}
    for line in (ROOT / "scripts" / "agents").read_text().splitlines():
        match = re.match(r'(\w+)_VERSION="\$\{\w+:-([^}]+)\}"', line)
        if match:
            out[match.group(1).lower()] = match.group(2)
    return out


def _agents() -> dict[str, str]:
    done = subprocess.run(
        [str(ROOT / "scripts" / "agents"), "--quiet"], capture_output=True, text=True, check=True
    )
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


if __name__ == "__main__":
    main()
