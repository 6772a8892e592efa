"""What ctxbudget saves a Claude Code or Codex user, on sessions the real agents recorded.

1. Record: the real Claude Code 2.1.330 and Codex 0.169.0 (`scripts/agents`) each work in a
   real workspace — this repository at HEAD (`git archive`), with a large instruction file
   (CLAUDE.md / AGENTS.md: ../shared/DESIGN.md + docs/architecture.md, ~40 K chars) — reading
   files and running commands, scripted by the stand-in (`tests/standin.py`), straight to it.
   Every request they send is kept.
2. Replay each recorded session to a fresh stand-in, which bills as the provider does (o200k
   tokens per block; Anthropic caches at `cache_control` markers, OpenAI the longest prefix
   seen): once as recorded (without ctxbudget), once through `ctxbudget serve` at the default
   caps (budget on). Cost at litellm's prices for the model the agent asked for.
3. The tool-search advice: Claude Code with a stdio MCP server of 60 tools
   (`tests/e2e/mcp_server.py`) doing one MCP call, recorded with tool search off
   (ENABLE_TOOL_SEARCH=false: the 60 definitions inline) and on (=true: ToolSearch loads the
   one tool), both replayed without ctxbudget.

    .venv/bin/python bench/agents.py          # ~1 minute
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.server import serve, standin_config  # noqa: E402
from tests.standin import billed_as_reported, run_standin  # noqa: E402

CLASSES = ("input", "cacheRead", "cacheWrite", "output")
MCP_SERVER = ROOT / "tests" / "e2e" / "mcp_server.py"


def _agents() -> dict[str, str]:
    done = subprocess.run(
        [str(ROOT / "scripts" / "agents"), "--quiet"], capture_output=True, text=True, check=True
    )
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


WORK = "work"
"""The workspace's folder in each agent's temporary folder."""


def _workspace(tmp: Path, instructions: str) -> Path:
    work = tmp / WORK
    work.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive.stdout, check=True)
    text = (ROOT.parent / "shared" / "DESIGN.md").read_text()
    text += "\n\n" + (ROOT / "docs" / "architecture.md").read_text()
    (work / instructions).write_text(text)
    return work


def _env(agents: dict[str, str], home: Path) -> dict[str, str]:
    node = Path(agents["NODE26"]).parent
    return {"PATH": f"{node}:/usr/bin:/bin", "HOME": str(home), "TERM": "dumb"}


def _claude(
    agents: dict[str, str], standin: Any, work: Path, home: Path, *, extra: dict[str, str],
    args: list[str], prompt: str,
) -> None:  # fmt: skip
    env = _env(agents, home) | {
        "ANTHROPIC_BASE_URL": standin.root,
        "ANTHROPIC_API_KEY": "sk-bench",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        **extra,
    }
    argv = [agents["CLAUDE"], "-p", prompt, "--output-format", "json", "--no-session-persistence"]
    done = subprocess.run(
        [*argv, *args], env=env, cwd=work, capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def record_claude(agents: dict[str, str], standin: Any, tmp: Path) -> list[dict[str, Any]]:
    work = _workspace(tmp / "claude", "CLAUDE.md")
    home = tmp / "claude" / "home"
    home.mkdir()
    standin.reset()
    standin.script = [
        ("Read", {"file_path": str(work / "proxy/pipeline/stages.py")}),
        ("Read", {"file_path": str(work / "caps/bootstrap.py")}),
        ("Grep", {"pattern": "def ", "path": str(work / "proxy"), "output_mode": "content"}),
        ("Bash", {"command": "grep -rn 'class ' proxy caps memory", "description": "classes"}),
        ("Bash", {"command": "sed -n 1,300p docs/benchmarks.md", "description": "read docs"}),
        ("Bash", {"command": "ls -R caps proxy memory tests", "description": "list files"}),
        ("Read", {"file_path": str(work / "docs/security.md")}),
    ]
    _claude(
        agents, standin, work, home, extra={}, args=["--allowedTools", "Bash,Grep"],
        prompt="Explain how a request goes through the proxy",
    )  # fmt: skip
    return [_recorded(r) for r in standin.received if r.path == "/v1/messages"]


def record_codex(agents: dict[str, str], standin: Any, tmp: Path) -> list[dict[str, Any]]:
    work = _workspace(tmp / "codex", "AGENTS.md")
    home = tmp / "codex" / "home"
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(
        'check_for_update_on_startup = false\nmodel = "gpt-5-codex"\nmodel_provider = "bench"\n'
        f'[model_providers.bench]\nname = "bench"\nbase_url = "{standin.base_url}"\n'
        'wire_api = "responses"\nenv_key = "BENCH_KEY"\n[analytics]\nenabled = false\n'
    )
    standin.reset()
    standin.script = [
        ("exec_command", {"cmd": "sed -n 1,250p proxy/pipeline/stages.py"}),
        ("exec_command", {"cmd": "grep -rn 'def ' proxy"}),
        ("exec_command", {"cmd": "sed -n 1,300p docs/benchmarks.md"}),
        ("exec_command", {"cmd": "ls -R caps proxy memory"}),
        ("exec_command", {"cmd": "sed -n 1,200p docs/security.md"}),
    ]
    env = _env(agents, home) | {"CODEX_HOME": str(codex_home), "BENCH_KEY": "sk-bench"}
    argv = [agents["CODEX"], "exec", "--skip-git-repo-check", "-s", "danger-full-access"]
    done = subprocess.run(
        [*argv, "Explain how a request goes through the proxy"], env=env, cwd=work,
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return [_recorded(r) for r in standin.received if r.path == "/v1/responses"]


def record_tool_search(
    agents: dict[str, str], standin: Any, tmp: Path, on: bool
) -> list[dict[str, Any]]:
    folder = tmp / f"mcp-{'on' if on else 'off'}"
    work, home = folder / "work", folder / "home"
    work.mkdir(parents=True)
    home.mkdir()
    servers = {"inventory": {"command": sys.executable, "args": [str(MCP_SERVER), "60"]}}
    (folder / "mcp.json").write_text(json.dumps({"mcpServers": servers}))
    tool = "mcp__inventory__lookup_007"
    standin.reset()
    standin.script = [(tool, {"query": "widgets"})]
    if on:
        standin.script.insert(0, ("ToolSearch", {"query": f"select:{tool}", "max_results": 1}))
    _claude(
        agents, standin, work, home,
        extra={"ENABLE_TOOL_SEARCH": "true" if on else "false"},
        args=["--mcp-config", str(folder / "mcp.json"), "--strict-mcp-config",
              "--allowedTools", tool],
        prompt="Look up widgets",
    )  # fmt: skip
    return [_recorded(r) for r in standin.received if r.path == "/v1/messages"]


def _recorded(r: Any) -> dict[str, Any]:
    return {"path": r.path, "query": r.query, "body": r.json}


HEADERS = {"x-api-key": "sk-bench", "authorization": "Bearer sk-bench"}


def replay(
    standin: Any, base: str, session: list[dict[str, Any]], name: str
) -> tuple[list[dict[str, int]], list[httpx.Response]]:
    """The stand-in's bill for each request of `session` posted to `base` (JSON answers)."""
    standin.reset()
    standin.call_tools = False  # answers are text; the recorded requests are what they are
    replies = []
    for r in session:
        url = f"{base}{r['path']}" + (f"?{r['query']}" if r["query"] else "")
        headers = {**HEADERS, "x-context-budget-session": name.lower().replace(" ", "-")}
        replies.append(
            httpx.post(url, json={**r["body"], "stream": False}, headers=headers, timeout=120)
        )
    assert all(x.status_code == 200 for x in replies), [x.text[:300] for x in replies]
    return [billed_as_reported(u, session[0]["path"]) for u in standin.billed], replies


def _usd(usages: list[dict[str, int]], model: str) -> float:
    from ctxbudget.proxy.report.prices import prices

    p = prices(model)
    assert p is not None, model
    rate = {"input": p.input, "cacheRead": p.cache_read, "cacheWrite": p.cache_write,
            "output": p.output}  # fmt: skip
    return sum(u[k] * rate[k] for u in usages for k in CLASSES)


def _prompt(usages: list[dict[str, int]]) -> int:
    return sum(u[k] for u in usages for k in CLASSES[:3])


def main() -> None:
    agents = _agents()
    with run_standin() as standin, tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        sessions = {
            "Claude Code": record_claude(agents, standin, tmp),
            "Codex": record_codex(agents, standin, tmp),
        }
        mcp_off = record_tool_search(agents, standin, tmp, on=False)
        mcp_on = record_tool_search(agents, standin, tmp, on=True)

        results: dict[str, Any] = {}
        for name, session in sessions.items():
            without, _ = replay(standin, standin.root, session, name)
            results[name] = {"without": without}
        config = standin_config(tmp, standin)
        with serve(tmp, config) as server:
            for name, session in sessions.items():
                results[name]["with"], replies = replay(standin, server.root, session, name)
                results[name]["clamped"] = [r.headers["x-context-budget-clamped"] for r in replies]
            report = server.report()
        tools_off, _ = replay(standin, standin.root, mcp_off, "mcp-off")
        tools_on, _ = replay(standin, standin.root, mcp_on, "mcp-on")

    by_id = {s["id"]: s for s in report["sessions"]}
    by_id = {name: by_id[name.lower().replace(" ", "-")] for name in sessions}
    print("session       model            reqs  prompt tokens without → with        "
          "cost without → with      net saved        per request    report's estimate")  # fmt: skip
    for name, session in sessions.items():
        model = session[0]["body"]["model"]
        without, with_ = results[name]["without"], results[name]["with"]
        truth, cost = _usd(without, model), _usd(with_, model)
        saved = truth - cost
        n = len(session)
        print(
            f"{name:13} {model:16} {n:4}  {_prompt(without):8,} → {_prompt(with_):8,} "
            f"({(_prompt(with_) - _prompt(without)) / _prompt(without):+.1%})  "
            f"${truth:.4f} → ${cost:.4f}  ${saved:.4f} ({saved / truth:.1%})  "
            f"{(_prompt(without) - _prompt(with_)) / n:,.0f} tok ${saved / n:.4f}  "
            f"${by_id[name]['withoutCtxbudgetUsd'] - by_id[name]['costUsd']:.4f}"
        )
        print(f"   clamped per request: {results[name]['clamped']}")
    kinds: dict[tuple[str, str], list[int]] = {}
    for r in report["recent"]:
        for s in r["segments"]:
            if s["action"] == "clamped":
                kinds.setdefault((s["kind"], s["label"].split(" ")[0]), []).append(s["saved"])
    for (kind, label), saved_chars in sorted(kinds.items()):
        label = label.rsplit(f"/{WORK}/", 1)[-1]  # the file's path in the workspace
        print(f"   {kind:12} {label:14} {len(saved_chars):3}× −{sum(saved_chars):,} chars")

    model = mcp_off[0]["body"]["model"]
    inline = [t for t in mcp_off[0]["body"]["tools"] if t["name"].startswith("mcp__")]
    off_usd, on_usd = _usd(tools_off, model), _usd(tools_on, model)
    print(
        f"tool search: {len(inline)} MCP tools inline, one MCP call — off: {len(mcp_off)} "
        f"requests, {_prompt(tools_off):,} prompt tokens, ${off_usd:.4f}; on: {len(mcp_on)} "
        f"requests, {_prompt(tools_on):,} prompt tokens, ${on_usd:.4f}; the advice saves "
        f"${off_usd - on_usd:.4f} ({(off_usd - on_usd) / off_usd:.0%})"
    )
    from ctxbudget.proxy.report.prices import prices

    p = prices(model)
    assert p is not None
    extra = _prompt(tools_off[:1]) - _prompt(tools_on[:1])  # the same first request but the tools
    print(
        f"   the 60 definitions inline: +{extra:,} prompt tokens on every request = "
        f"${extra * p.cache_write:.4f} written (a new or expired cache), "
        f"${extra * p.cache_read:.4f} read (warm); over a 50-request session ~"
        f"${extra * (p.cache_write + 49 * p.cache_read):.2f}"
    )


if __name__ == "__main__":
    os.environ.pop("CTXBUDGET_CONFIG", None)
    main()
