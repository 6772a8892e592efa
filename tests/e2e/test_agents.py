"""The real agents (Claude Code, Codex CLI and OpenClaw) through the real proxy to the stand-in.

Each agent plays one tool turn (tool call, tool result, final text) with the budget on, in an
`env -i`-style environment: no real home, no tty, stdin closed. The stand-in scripts the turn
and answers the tool result with "standin: done after tool <name>; result had <n> chars", so the
agent's final answer shows the request went round. The binaries come from `scripts/agents`
(npm, cached in ~/.cache/ctxbudget-agents). OpenClaw takes ~20 s a run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.checks import WRAP_END, WRAP_START, bootstrap_bodies, skeleton, u16
from tests.e2e.server import ProxyServer, serve, standin_config
from tests.standin import Received, StandIn

ROOT = Path(__file__).resolve().parents[2]
CAP = 8000  # contextBudget's default bootstrapMaxChars and webFetchMaxChars
SECRET = "The secret word is marmalade."
HOP_BY_HOP = {"host", "content-length", "connection"}


@pytest.fixture(scope="module")
def agents() -> dict[str, str]:
    """NODE26, CLAUDE, CODEX, OPENCLAW → executable. Installing is part of the test: a failure
    fails, it does not skip (CI installs them)."""
    try:
        done = subprocess.run(
            [str(ROOT / "scripts" / "agents"), "--quiet"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=900,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"scripts/agents did not finish in 900 s:\n{e.stdout!r}\n{e.stderr!r}")
    if done.returncode != 0:
        pytest.fail(f"scripts/agents failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    paths = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    missing = {"NODE26", "CLAUDE", "CODEX", "OPENCLAW"} - set(paths)
    if missing:
        pytest.fail(f"scripts/agents printed no {sorted(missing)}:\n{done.stdout}")
    return paths


@pytest.fixture(scope="module")
def web_page() -> Iterator[str]:
    """The URL of a ~50 K-char HTML page on 127.0.0.1, for OpenClaw's web_fetch."""
    paragraphs = "".join(
        f"<p>Paragraph {i}: lorem ipsum dolor sit amet, consectetur adipiscing elit.</p>"
        for i in range(600)
    )
    page = f"<html><head><title>Test Page</title></head><body><article>{paragraphs}</article>"
    body = f"{page}</body></html>".encode()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/html; charset=utf-8")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/page"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_claude_code_reads_a_file_through_the_proxy(
    tmp_path: Path, standin: StandIn, agents: dict[str, str]
) -> None:
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / "note.txt").write_text(SECRET + "\n")
    # Claude Code reads a file inside its cwd without asking, given an absolute path.
    standin.tool_inputs["Read"] = {"file_path": str(work / "note.txt")}
    session = str(uuid.uuid4())

    def claude(base_url: str) -> dict[str, Any]:
        env = _env(agents, home) | {
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": "sk-test",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
        argv = [agents["CLAUDE"], "-p", "Read note.txt and tell me the secret word"]
        argv += ["--output-format", "json", "--session-id", session, "--no-session-persistence"]
        done = _run(argv, env=env, cwd=work, timeout=60)
        assert done.returncode == 0, _describe(done)
        out: dict[str, Any] = json.loads(done.stdout)
        return out

    # The same session straight to the stand-in, for what Claude Code sends with no proxy.
    claude(standin.root)
    direct = list(standin.received)
    standin.received.clear()
    with serve(tmp_path, standin_config(tmp_path, standin)) as server:
        out = claude(server.root)
        recent = _recent(server, 2)

    got = standin.received
    assert [(r.method, r.path, r.query) for r in got] == [("POST", "/v1/messages", "beta=true")] * 2
    result = _tool_results(got[1].json)
    assert SECRET in result["content"]
    assert out["result"] == _said("Read", result["content"])
    assert out["session_id"] == session
    for before, after in zip(direct, got, strict=True):
        headers = after.headers
        assert headers["anthropic-version"] == "2023-06-01"
        assert headers["anthropic-beta"].startswith("claude-code-20250219,")
        assert headers["x-claude-code-session-id"] == session
        assert headers["x-api-key"] == "sk-test"  # no key configured: the client's goes on
        assert _end_to_end(after.headers) == _end_to_end(before.headers)
    # Nothing is clamped or injected for Claude Code, so its bytes go upstream unchanged
    # (the stand-in's own tool ids aside, which differ between the two runs).
    assert [skeleton(_masked(r)) for r in got] == [skeleton(_masked(r)) for r in direct]
    assert [_masked_text(r) for r in got] == [_masked_text(r) for r in direct]
    first, second = (r.json for r in got)
    # messages[1] is Claude Code's `role: "system"` environment message, in both requests.
    assert [m["role"] for m in first["messages"]] == ["user", "system"]
    assert [m["role"] for m in second["messages"]] == ["user", "system", "assistant", "user"]
    assert first["messages"][1]["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert isinstance(second["messages"][1]["content"], str)
    for body in (first, second):
        assert json.loads(body["metadata"]["user_id"])["session_id"] == session
        assert body["context_management"]["edits"][0]["type"] == "clear_thinking_20251015"
        assert body["thinking"]["type"] in ("adaptive", "enabled")
    assert [(r["wire"], r["status"], r["clamped"], r["segments"]) for r in recent] == [
        ("messages", 200, 0, [])
    ] * 2
    assert all(r["clampError"] is None and r["memories"] == 0 for r in recent)


def test_codex_runs_a_command_through_the_proxy(
    tmp_path: Path, standin: StandIn, agents: dict[str, str]
) -> None:
    work, home = tmp_path / "work", tmp_path / "home"
    codex_home = home / ".codex"
    work.mkdir()
    codex_home.mkdir(parents=True)
    (work / "note.txt").write_text(SECRET + "\n")
    standin.tool_inputs["exec_command"] = {"cmd": f"cat {work / 'note.txt'}"}
    with serve(tmp_path, standin_config(tmp_path, standin)) as server:
        (codex_home / "config.toml").write_text(
            "check_for_update_on_startup = false\n"
            'model = "mock-model"\n'
            'model_provider = "mock"\n\n'
            "[model_providers.mock]\n"
            'name = "mock"\n'
            f'base_url = "{server.base_url}"\n'
            'wire_api = "responses"\n'
            'env_key = "MOCK_API_KEY"\n\n'
            "[analytics]\nenabled = false\n\n"
            "[feedback]\nenabled = false\n"
        )
        env = _env(agents, home) | {"CODEX_HOME": str(codex_home), "MOCK_API_KEY": "sk-test"}
        last = tmp_path / "last.txt"
        # No sandbox: `cat` is harmless, and bubblewrap needs user namespaces CI may not have.
        argv = [agents["CODEX"], "exec", "--skip-git-repo-check", "-s", "danger-full-access"]
        argv += ["-o", str(last), "Run cat note.txt and tell me the secret word"]
        done = _run(argv, env=env, cwd=work, timeout=60)
        recent = _recent(server, 2)
    assert done.returncode == 0, _describe(done)

    got = standin.received
    assert [(r.method, r.path, r.query) for r in got] == [("POST", "/v1/responses", "")] * 2
    second = got[1].json
    call, output = [i for i in second["input"] if i.get("type", "").startswith("function_call")]
    assert (call["name"], json.loads(call["arguments"])) == (
        "exec_command",
        {"cmd": "cat " + str(work / "note.txt")},
    )
    assert output["call_id"] == call["call_id"]
    assert SECRET in output["output"]
    assert last.read_text().strip() == _said("exec_command", output["output"])
    session = got[0].headers["session-id"]
    for r in got:
        assert r.headers["session-id"] == session
        assert r.headers["authorization"] == "Bearer sk-test"
        assert json.loads(r.headers["x-codex-turn-metadata"])["session_id"] == session
        assert r.json["prompt_cache_key"] == session
        assert r.json["client_metadata"]["session_id"] == session
    assert [(r["wire"], r["status"], r["clamped"], r["segments"]) for r in recent] == [
        ("responses", 200, 0, [])
    ] * 2


@pytest.mark.parametrize(
    ("wire", "tool_search"),
    [("messages", True), ("responses", False)],
    ids=["messages-bridged", "responses-direct"],
)
def test_openclaw_turn_is_clamped_through_the_proxy(
    tmp_path: Path,
    standin: StandIn,
    agents: dict[str, str],
    web_page: str,
    wire: str,
    tool_search: bool,
) -> None:
    """An OpenClaw turn that fetches a big page, with a big AGENTS.md: both get clamped. With
    tool search on (OpenClaw's default) web_fetch goes through the `tool_call` bridge; off,
    it is a direct tool — one of each, so both shapes of the result are clamped."""
    ws, home = tmp_path / "ws", tmp_path / "home"
    ws.mkdir()
    home.mkdir()
    rules = "".join(f"Rule {i}: keep answers short and the workspace tidy.\n" for i in range(700))
    agents_md = ("# Agents\n\n" + rules)[:30_000]
    (ws / "AGENTS.md").write_text(agents_md)
    if tool_search:
        standin.script_tool = ("tool_call", {"id": "web_fetch", "args": {"url": web_page}})
    else:
        standin.script_tool = ("web_fetch", {"url": web_page})

    with serve(tmp_path, standin_config(tmp_path, standin)) as server:
        if wire == "messages":
            name, model, key = "anthropic", "claude-sonnet-4-5", "sk-ant-test"
            provider: dict[str, Any] = {"api": "anthropic-messages", "baseUrl": server.root}
        else:
            name, model, key = "myresp", "gpt-x", "sk-test"
            provider = {"api": "openai-responses", "baseUrl": server.base_url}
        provider |= {"apiKey": key, "models": [_openclaw_model(model)]}
        fetch = {"ssrfPolicy": {"dangerouslyAllowPrivateNetwork": True}}  # the page is local
        config: dict[str, Any] = {
            "agents": {"defaults": {"workspace": str(ws), "model": {"primary": f"{name}/{model}"}}},
            "models": {"mode": "merge", "providers": {name: provider}},
            "tools": {"web": {"fetch": fetch}},
            "memory": {"search": {"provider": "none"}},
        }
        if not tool_search:
            config["tools"]["toolSearch"] = False
        (tmp_path / "openclaw.json").write_text(json.dumps(config))
        env = _env(agents, home) | {
            "OPENCLAW_CONFIG_PATH": str(tmp_path / "openclaw.json"),
            "OPENCLAW_STATE_DIR": str(tmp_path / "state"),
            "OPENCLAW_NO_AUTO_UPDATE": "1",
            "OPENCLAW_TELEMETRY": "0",
            "DO_NOT_TRACK": "1",
        }
        argv = [agents["OPENCLAW"], "agent", "--local", "--agent", "main", "--session-key", "t1"]
        argv += ["--message", f"Fetch {web_page} and summarise it", "--json"]
        # OpenClaw retries a failing upstream for ~2 minutes: a timeout here means exactly that.
        done = _run(argv, env=env, cwd=tmp_path, timeout=150)
        recent = _recent(server, 2)
    assert done.returncode == 0, _describe(done)

    got = standin.received
    path = "/v1/messages" if wire == "messages" else "/v1/responses"
    assert [(r.method, r.path, r.query) for r in got] == [("POST", path, "")] * 2, _describe(done)
    first, second = (r.json for r in got)
    result = _tool_results(second) if wire == "messages" else _outputs(second)
    assert json.loads(done.stdout)["payloads"][-1]["text"] == _said(
        "tool_call" if tool_search else "web_fetch", result["content"]
    )

    for r in got:
        if wire == "messages":
            assert r.headers["anthropic-version"] == "2023-06-01"
            assert r.headers["x-api-key"] == key
            system = r.json["system"][0]["text"]
        else:
            assert r.headers["authorization"] == f"Bearer {key}"
            (item,) = [i for i in r.json["input"] if i.get("role") == "system"]
            system = item["content"][0]["text"]
        for marker in ("<!-- openclaw:attempt:STABLE -->", "<!-- /openclaw:attempt:STABLE -->"):
            assert system.count(marker) == 1, marker
        bodies = bootstrap_bodies(system)
        assert str(ws / "AGENTS.md") in bodies, list(bodies)
        for file, body in bodies.items():
            assert u16(body) <= CAP, f"{file}: {u16(body)} > {CAP}"
        clamped = bodies[str(ws / "AGENTS.md")]
        assert clamped.startswith("# Agents\n\nRule 0:")
        assert "truncated" in clamped

    if wire == "messages":
        # OpenClaw's markers: system[0], the last tool, the latest user text, the newest tool
        # result (3 before the tool call, 4 after); clamping system[0] keeps its marker.
        for body, expected in ((first, 3), (second, 4)):
            marks = _cache_marks(body)
            assert len(marks) == expected, marks
            assert {("system", 0), ("tools", len(body["tools"]) - 1)} <= set(marks)
            assert ("messages", 0, "content", 0) in marks
        assert ("messages", 2, "content", 0) in _cache_marks(second)
    else:
        assert _cache_marks(first) == _cache_marks(second) == []

    text = result["content"]
    if tool_search:  # the bridge envelope, wrapped whole as external content
        assert u16(text) <= CAP, u16(text)
    else:
        payload = json.loads(text)
        text = payload["text"]
        assert u16(text) <= CAP, u16(text)
        assert payload["truncated"] is True
        assert payload["length"] == u16(text)
    assert WRAP_START.findall(text) == WRAP_END.findall(text) != []
    assert "truncated" in text

    assert [(r["wire"], r["status"], r["clampError"]) for r in recent] == [(wire, 200, None)] * 2
    assert all(r["clamped"] >= 1 for r in recent)
    for row in recent:
        segments = row["segments"]
        boot = [s for s in segments if s["kind"] == "bootstrap" and s["action"] == "clamped"]
        assert len(boot) == 1 and boot[0]["after"] <= CAP < boot[0]["before"], segments
    fetched = [s for s in recent[1]["segments"] if s["kind"] == "web_fetch"]
    assert [s["action"] for s in fetched] == ["clamped"], recent[1]["segments"]
    assert fetched[0]["after"] <= CAP < fetched[0]["before"]


# --- helpers ---------------------------------------------------------------------------------


def _recent(server: ProxyServer, n: int) -> list[dict[str, Any]]:
    """The report's latest `n` requests, oldest first. A request is recorded once its answer
    has streamed out, which can be just after the agent has read it and exited."""
    deadline = time.monotonic() + 10
    while True:
        recent: list[dict[str, Any]] = server.report()["recent"]
        if len(recent) >= n or time.monotonic() > deadline:
            return recent[:n][::-1]
        time.sleep(0.05)


def _env(agents: dict[str, str], home: Path) -> dict[str, str]:
    """A bare environment: nothing from the real one. Node 26 comes first on PATH for the
    node processes OpenClaw starts."""
    node = Path(agents["NODE26"]).parent
    return {"PATH": f"{node}:/usr/bin:/bin", "HOME": str(home), "TERM": "dumb"}


def _run(
    argv: list[str], *, env: dict[str, str], cwd: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run an agent in its own process group; on timeout, kill the group and fail."""
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        done = subprocess.CompletedProcess(argv, process.returncode, out, err)
        pytest.fail(f"{Path(argv[0]).name} did not finish in {timeout} s\n{_describe(done)}")
    finally:
        try:  # helpers an agent left behind
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(argv, process.returncode, out, err)


def _describe(done: subprocess.CompletedProcess[str]) -> str:
    out, err = done.stdout[-4000:], done.stderr[-4000:]
    return f"exit {done.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"


def _said(tool: str, result: str) -> str:
    """The stand-in's answer to a tool result (tests/standin.py)."""
    return f"standin: done after tool {tool}; result had {len(result)} chars"


def _tool_results(body: dict[str, Any]) -> dict[str, Any]:
    """The one tool_result block of a Messages body, its content a string."""
    (block,) = [
        b
        for m in body["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]
    assert isinstance(block["content"], str)
    return dict(block)


def _outputs(body: dict[str, Any]) -> dict[str, Any]:
    """The one function_call_output of a Responses body, as {"content": output}."""
    (item,) = [i for i in body["input"] if i.get("type") == "function_call_output"]
    assert isinstance(item["output"], str)
    return {"content": item["output"]}


def _end_to_end(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k not in HOP_BY_HOP}


def _stand_in_ids(received: Received) -> list[str]:
    """The tool ids the stand-in made up (random), which a replay carries."""
    return [
        b["id"]
        for m in received.json["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_use"
    ]


def _masked_text(received: Received) -> str:
    text = received.body.decode()
    for n, tool_id in enumerate(_stand_in_ids(received)):
        text = text.replace(tool_id, f"toolu_standin_{n}")
    return text


def _masked(received: Received) -> Any:
    return json.loads(_masked_text(received))


def _cache_marks(body: Any) -> list[tuple[str | int, ...]]:
    """Where `cache_control` sits in a body, as paths of keys and indexes."""
    marks: list[tuple[str | int, ...]] = []

    def walk(value: Any, at: tuple[str | int, ...]) -> None:
        if isinstance(value, dict):
            if "cache_control" in value:
                marks.append(at)
            for key, item in value.items():
                walk(item, (*at, key))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, (*at, index))

    walk(body, ())
    return marks


def _openclaw_model(model: str) -> dict[str, Any]:
    return {
        "id": model,
        "name": "Stand-in",
        "reasoning": False,
        "input": ["text"],
        "contextWindow": 200_000,
        "maxTokens": 4096,
    }
