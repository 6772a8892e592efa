"""The real agents (Claude Code, Codex CLI and OpenClaw) through the real proxy to the stand-in.

Each agent plays tool turns (tool calls, tool results, final text) with the budget on, in an
`env -i`-style environment: no real home, no tty, stdin closed. The stand-in scripts the turns
and answers the last tool result with "standin: done after tool <name>; result had <n> chars",
so the agent's final answer shows the request went round. The binaries come from
`scripts/agents` (npm, cached in ~/.cache/ctxbudget-agents). OpenClaw takes ~20 s a run, Claude
Code and Codex 1-3 s: each test reuses one run for as many checks as it can.

Where the agent's own bytes matter, a TCP tap (`tests/e2e/tap.py`) sits between the agent and
the proxy: what the agent sent is compared with what the upstream received (only the capped
texts may differ), and what the upstream streamed with what the agent got (byte for byte).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.checks import WRAP_END, WRAP_START, bootstrap_bodies, u16
from tests.e2e.server import ProxyServer, serve, standin_config
from tests.e2e.tap import Exchange, Tap
from tests.pages import serve_pages
from tests.processes import run_agent
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

    with serve_pages({"/page": body}) as root:
        yield f"{root}/page"


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
    """Run an agent (`run_agent`); fail the test when it does not finish in `timeout` s."""
    done, late = run_agent(argv, env=env, cwd=cwd, timeout=timeout)
    if late:
        pytest.fail(f"{Path(argv[0]).name} did not finish in {timeout} s\n{_describe(done)}")
    return done


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


# --- Claude Code and Codex: what their users pay for (issue 21) -------------------------------

TOOL_CAP = 16000  # contextBudget.toolOutputMaxChars' default
RULES = "".join(f"Rule {i}: keep answers short and the workspace tidy.\n" for i in range(700))
CLAUDE_MD = ("# Project rules\n\n" + RULES)[:30_000]
MCP_SERVER = Path(__file__).with_name("mcp_server.py")


def _claude_env(agents: dict[str, str], home: Path, base_url: str) -> dict[str, str]:
    return _env(agents, home) | {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "sk-test",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }


def _claude(
    agents: dict[str, str], prompt: str, *, env: dict[str, str], cwd: Path, args: list[str]
) -> dict[str, Any]:
    argv = [agents["CLAUDE"], "-p", prompt, "--output-format", "json", *args]
    done = _run(argv, env=env, cwd=cwd, timeout=90)
    assert done.returncode == 0, _describe(done)
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def _sections(text: str) -> dict[str, str]:
    """Path → body of each `Contents of <path> (<description>):` section of a reminder
    (read here from the captured layout, not with caps' own code)."""
    assert text.startswith("<system-reminder>\n") and text.endswith("\n</system-reminder>")
    inner = text[: -len("\n</system-reminder>")]
    out = {}
    for section in inner.split("\n\nContents of ")[1:]:
        header, body = section.split("\n\n", 1)
        out[header.rsplit(" (", 1)[0]] = body
    return out


def _instructions(body: dict[str, Any]) -> tuple[int, str]:
    """(part index, text) of the instruction block in the first user message."""
    first = body["messages"][0]["content"]
    (found,) = [
        (i, p["text"])
        for i, p in enumerate(first)
        if p.get("type") == "text" and "\n\nContents of " in p["text"]
    ]
    return found


def _results(body: dict[str, Any]) -> dict[str, Any]:
    """tool_use id → (tool name, the tool_result's content) of a Messages body."""
    names = {
        b["id"]: b["name"]
        for m in body["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_use"
    }
    return {
        b["tool_use_id"]: (names[b["tool_use_id"]], b["content"])
        for m in body["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    }


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content)


def _raw_fields(body: bytes) -> dict[str, bytes]:
    """Each top-level field of a JSON object as its raw bytes (what went on the wire)."""
    text = body.decode()
    decoder = json.JSONDecoder()
    at = text.index("{") + 1
    fields: dict[str, bytes] = {}
    while True:
        while text[at] in " \t\r\n,":
            at += 1
        if text[at] == "}":
            return fields
        key, at = decoder.raw_decode(text, at)
        at = text.index(":", at) + 1
        while text[at] in " \t\r\n":
            at += 1
        _, end = decoder.raw_decode(text, at)
        fields[key] = text[at:end].encode()
        at = end


def _pairs(tap: Tap, standin: StandIn) -> list[tuple[Exchange, Received]]:
    """The agent's requests (through the tap) with what the upstream received for each, in
    order; every streamed answer reached the agent exactly as the upstream sent it."""
    exchanges = [e for e in tap.exchanges() if e.method == "POST"]
    got = standin.received
    assert [(e.target.split("?")[0]) for e in exchanges] == [r.path for r in got]
    for exchange, received in zip(exchanges, got, strict=True):
        assert exchange.status == 200
        if received.sent is not None:  # the SSE relay: byte for byte
            assert exchange.response_body == received.sent
    return list(zip(exchanges, got, strict=True))


def _same_headers(exchange: Exchange, received: Received) -> None:
    skip = HOP_BY_HOP | {"accept-encoding"}
    sent = {k: v for k, v in exchange.request_headers.items() if k not in skip}
    assert {k: v for k, v in received.headers.items() if k in sent} == sent


def test_claude_code_session_is_clamped_through_the_proxy(
    tmp_path: Path, standin: StandIn, agents: dict[str, str]
) -> None:
    """A real Claude Code session in a workspace with a 30,000-char CLAUDE.md: a Read of a
    40 KB file, then a command that prints 24 KB. In every request the CLAUDE.md is clamped
    to the bootstrap cap, the Read result goes up as it came, the Bash result is cut to the
    tool-output cap; nothing else differs from what Claude Code sent (ids, pairing,
    cache_control markers, thinking, headers), and every stream reaches it byte for byte."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    (home / ".claude").mkdir(parents=True)
    (work / "CLAUDE.md").write_text(CLAUDE_MD)
    (work / "CLAUDE.local.md").write_text("# Local\n\nMy private notes.\n")
    (home / ".claude" / "CLAUDE.md").write_text("# Mine\n\nAlways be kind.\n")
    source = "".join(f"def f{i}():\n    return {i}  # a line of code\n" for i in range(900))
    (work / "big.py").write_text(source)
    standin.script = [
        ("Read", {"file_path": str(work / "big.py")}),
        ("Bash", {"command": "seq 1 5000", "description": "Print numbers"}),
    ]
    with serve(tmp_path, standin_config(tmp_path, standin)) as server, Tap(server.port) as tap:
        env = _claude_env(agents, home, tap.root)
        session = str(uuid.uuid4())
        args = ["--allowedTools", "Bash", "--no-session-persistence", "--session-id", session]
        out = _claude(agents, "Read big.py, then count to 5000", env=env, cwd=work, args=args)
        recent = _recent(server, 3)

    every = _pairs(tap, standin)
    assert {(r.path, r.query) for _, r in every} <= {
        ("/v1/messages", "beta=true"),
        ("/v1/messages/count_tokens", "beta=true"),  # Claude Code sizes a large Read with it
    }
    for exchange, received in every:  # token counts: forwarded as sent (nothing to clamp)
        if received.path.endswith("/count_tokens"):
            assert received.body == exchange.request_body
            assert json.loads(exchange.response_body)["input_tokens"] > 0
    pairs = [(e, r) for e, r in every if r.path == "/v1/messages"]
    assert len(pairs) == 3
    assert out["session_id"] == session
    for _, received in pairs:  # what Claude Code 2.1.330 sends (OPENCLAW_WIRE_FORMATS.md §7)
        body, headers = received.json, received.headers
        assert headers["anthropic-version"] == "2023-06-01"
        assert headers["anthropic-beta"].startswith("claude-code-20250219,")
        assert headers["x-claude-code-session-id"] == session
        assert headers["x-api-key"] == "sk-test"  # no key configured: the client's goes on
        assert json.loads(body["metadata"]["user_id"])["session_id"] == session
        assert body["context_management"]["edits"][0]["type"] == "clear_thinking_20251015"
        assert body["thinking"]["type"] in ("adaptive", "enabled")
        # messages[1] is Claude Code's `role: "system"` environment message
        assert [m["role"] for m in body["messages"][:2]] == ["user", "system"]
    assert pairs[0][1].json["messages"][1]["content"][0]["cache_control"] == {"type": "ephemeral"}
    paths = [
        str(work / "CLAUDE.md"),
        str(work / "CLAUDE.local.md"),
        str(home / ".claude/CLAUDE.md"),
    ]
    for exchange, received in pairs:
        _same_headers(exchange, received)
        sent, got = json.loads(exchange.request_body), received.json
        at, before = _instructions(sent)
        after = _instructions(got)[1]
        # the CLAUDE.md: head and tail within the cap, a marker naming the file
        files, clamped = _sections(before), _sections(after)
        assert sorted(files) == sorted(clamped) == sorted(paths)
        body = clamped[paths[0]]
        assert u16(body) <= CAP < u16(files[paths[0]])
        assert body.startswith("# Project rules\n\nRule 0:") and CLAUDE_MD.endswith(body[-500:])
        assert f"read {paths[0]} for full content" in body
        assert [clamped[p] for p in paths[1:]] == [files[p] for p in paths[1:]]
        # nothing else changed: put the client's texts back and the bodies are equal
        got["messages"][0]["content"][at]["text"] = before
        for call_id, (name, content) in _results(got).items():
            original = _results(sent)[call_id][1]
            if name == "Bash":
                text = _text_of(content)
                assert u16(text) <= TOOL_CAP < u16(_text_of(original))
                # the head, then what answers the question (`clampStrategy: query`) or the
                # tail, the gaps marked inline
                assert text.startswith("1\n2\n3\n")
                assert "[...skipped chars " in text or "truncated by ctxbudget" in text
            else:  # Read: never cut, whatever its size
                assert content == original and u16(_text_of(original)) > TOOL_CAP
        for block in (
            b for m in got["messages"] if isinstance(m["content"], list) for b in m["content"]
        ):
            if (
                block.get("type") == "tool_result"
                and _results(got)[block["tool_use_id"]][0] == "Bash"
            ):
                block["content"] = _results(sent)[block["tool_use_id"]][1]
        assert got == sent
        raw_sent, raw_got = _raw_fields(exchange.request_body), _raw_fields(received.body)
        assert {k: v for k, v in raw_got.items() if k != "messages"} == {
            k: v for k, v in raw_sent.items() if k != "messages"
        }
    bash = _results(pairs[2][1].json)
    assert out["result"] == _said(
        "Bash", _text_of(next(c for n, c in bash.values() if n == "Bash"))
    )

    assert {r["session"] for r in recent} == {session}
    for row in recent:  # the report names each file, every request
        boot = {s["label"]: s for s in row["segments"] if s["kind"] == "bootstrap"}
        assert sorted(boot) == sorted(paths)
        assert boot[paths[0]]["action"] == "clamped" and boot[paths[0]]["after"] <= CAP
        assert {boot[p]["action"] for p in paths[1:]} == {"kept"}
        assert not [s for s in row["segments"] if s["tool"] == "Read"]
    (bash_segment,) = [s for s in recent[2]["segments"] if s["kind"] == "tool_output"]
    assert bash_segment["tool"] == "Bash" and bash_segment["after"] <= TOOL_CAP


@pytest.fixture(scope="module")
def https_page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(URL, CA file) of a ~50 K-char page on https://127.0.0.1: Claude Code's WebFetch
    upgrades http:// to https://, and fetches with its own client (trusting the CA file via
    NODE_EXTRA_CA_CERTS)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is needed for the WebFetch test (scripts/packages installs it)")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
        + ["-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2"]
        + ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    paragraphs = "".join(
        f"<p>Paragraph {i}: lorem ipsum dolor sit amet, consectetur adipiscing elit.</p>"
        for i in range(600)
    )
    body = f"<html><head><title>Test Page</title></head><body>{paragraphs}</body></html>".encode()

    with serve_pages({"/page": body}, tls=(cert, key)) as root:
        yield f"{root}/page", cert


def _blocks(body: dict[str, Any], kind: str) -> list[Any]:
    return [
        b
        for m in body["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == kind
    ]


def _nested(body: dict[str, Any], kind: str) -> list[Any]:
    """Blocks of `kind` inside tool results (tool search's `tool_reference`)."""
    return [
        c
        for b in _blocks(body, "tool_result")
        if isinstance(b["content"], list)
        for c in b["content"]
        if c.get("type") == kind
    ]


def test_claude_code_tool_search_mcp_and_webfetch_through_the_proxy(
    tmp_path: Path, standin: StandIn, agents: dict[str, str], https_page: tuple[str, Path]
) -> None:
    """The real Claude Code with a stdio MCP server of 60 tools and ENABLE_TOOL_SEARCH=true:
    it loads WebFetch and one MCP tool by tool search, fetches a page, calls the tool.
    `defer_loading` tools, `tool_reference` and `server_tool_use` blocks and the beta header
    reach the upstream byte for byte; the page in WebFetch's summariser request is clamped
    as a web-fetch segment; the MCP tool's long answer as tool output. Then a session with
    tool search off (ENABLE_TOOL_SEARCH=auto: Claude Code counts the tools' tokens with
    count_tokens, finds them under 10% of the window and sends them inline) is flagged."""
    url, ca = https_page
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    (home / ".claude").mkdir(parents=True)
    # the page is on 127.0.0.1: no domain check with Anthropic (offline)
    (home / ".claude" / "settings.json").write_text(json.dumps({"skipWebFetchPreflight": True}))
    servers = {"inventory": {"command": sys.executable, "args": [str(MCP_SERVER), "60"]}}
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": servers}))
    tool = "mcp__inventory__lookup_007"
    standin.server_tool = True  # each scripted answer carries a server-side web search
    standin.script = [
        ("ToolSearch", {"query": f"select:WebFetch,{tool}", "max_results": 2}),
        ("WebFetch", {"url": url, "prompt": "Summarise the page"}),
        (tool, {"query": "widgets"}),
    ]
    mcp = ["--mcp-config", str(tmp_path / "mcp.json"), "--strict-mcp-config"]
    with serve(tmp_path, standin_config(tmp_path, standin)) as server, Tap(server.port) as tap:
        env = _claude_env(agents, home, tap.root) | {
            "ENABLE_TOOL_SEARCH": "true",
            "NODE_EXTRA_CA_CERTS": str(ca),
        }
        args = [*mcp, "--allowedTools", f"WebFetch,{tool}", "--no-session-persistence"]
        out = _claude(agents, "Fetch the page, then look up widgets", env=env, cwd=work, args=args)
        pairs = _pairs(tap, standin)
        searched = server.report()

        standin.reset()  # the same proxy, a session with tool search off
        standin.call_tools = False
        tap.connections.clear()
        env["ENABLE_TOOL_SEARCH"] = "auto"
        _claude(agents, "hello", env=env, cwd=work, args=[*mcp, "--no-session-persistence"])
        inline_pairs = _pairs(tap, standin)
        flagged = server.report()
        text = httpx.get(f"{server.root}/context/budget?format=text", timeout=10).text

    # 1. tool search: the agent's deferred tools, references, server blocks, betas, as sent
    main = [(e, r) for e, r in pairs if r.json.get("tools")]
    summariser = [(e, r) for e, r in pairs if r.path == "/v1/messages" and not r.json.get("tools")]
    assert len(main) == 4 and len(summariser) == 1, [r.path for _, r in pairs]
    # before tool search, the MCP tools are names in the system message only; then the ones
    # loaded are declared with `defer_loading`, their schemas found through `tool_reference`
    first_tools = [t["name"] for t in main[0][1].json["tools"] if t.get("defer_loading")]
    assert first_tools == ["DeferredToolPlaceholder"]
    assert "mcp__inventory__lookup_059" in json.dumps(main[0][1].json["messages"][1])
    references: list[Any] = []
    server_blocks: list[Any] = []
    for exchange, received in main:
        _same_headers(exchange, received)
        assert "advanced-tool-use-2025-11-20" in received.headers["anthropic-beta"]
        raw_sent, raw_got = _raw_fields(exchange.request_body), _raw_fields(received.body)
        assert raw_got["tools"] == raw_sent["tools"]
        loaded = {t["name"] for t in received.json["tools"] if t.get("defer_loading") is True}
        assert loaded <= {"DeferredToolPlaceholder", "WebFetch", tool}
        sent, got = json.loads(exchange.request_body), received.json
        for kind in ("server_tool_use", "web_search_tool_result", "thinking"):
            assert _blocks(got, kind) == _blocks(sent, kind)
        assert _nested(got, "tool_reference") == _nested(sent, "tool_reference")
        references = _nested(got, "tool_reference")
        server_blocks = _blocks(got, "server_tool_use")
    assert {r["tool_name"] for r in references} == {"WebFetch", tool}
    assert loaded == {"DeferredToolPlaceholder", "WebFetch", tool}
    assert len(server_blocks) == 3  # Claude Code replays the server's own tool use

    # 2. WebFetch: the page in the summariser's request, clamped as web fetch
    ((exchange, received),) = summariser
    page_sent = json.loads(exchange.request_body)["messages"][0]["content"][0]["text"]
    page_got = received.json["messages"][0]["content"][0]["text"]
    assert page_sent.startswith("\nWeb page content:\n---\nTest Page")
    prompt = page_sent[page_sent.rindex("\n---\n\nSummarise the page") :]
    assert page_got.endswith(prompt)  # the prompt and instructions: untouched
    page = page_got[len("\nWeb page content:\n---\n") : -len(prompt)]
    assert u16(page) <= CAP < u16(page_sent) - u16(prompt)
    assert page.startswith("Test Page") and "Paragraph 599:" in page

    # 3. the MCP tool's long answer: tool output, head and tail
    answers = [c for n, c in _results(main[-1][1].json).values() if n == tool]
    sent_answers = [
        c for n, c in _results(json.loads(main[-1][0].request_body)).values() if n == tool
    ]
    (answer,), (sent_answer,) = answers, sent_answers
    assert u16(_text_of(answer)) <= TOOL_CAP < u16(_text_of(sent_answer))
    assert _text_of(answer).startswith("lookup_007: 1000 records\n")
    assert _text_of(answer).endswith("end of lookup_007\n")
    assert out["result"] == _said(tool, _text_of(answer))

    kinds = {
        (s["kind"], s["label"].split(" ")[0]) for r in searched["recent"] for s in r["segments"]
    }
    assert ("web_fetch", "WebFetch") in kinds and ("tool_output", tool) in kinds
    assert [s["toolsInline"] for s in searched["sessions"]] == [None]

    # 4. tool search off: the tools go inline, counted first, and the session is flagged
    assert [r.path for _, r in inline_pairs] == [
        "/v1/messages/count_tokens",
        "/v1/messages",
    ]
    inline = [t for t in inline_pairs[-1][1].json["tools"] if t["name"].startswith("mcp__")]
    assert len(inline) == 60 and not any(t.get("defer_loading") for t in inline)
    session = flagged["sessions"][0]
    assert session["toolsInline"]["count"] == 60 and session["toolsInline"]["tokens"] > 5_000
    assert f"Tool search off: session {session['id']} sent 60 MCP tool definitions" in text
    assert "ENABLE_TOOL_SEARCH=true" in text


def _codex_home(home: Path, base_url: str, extra: str = "") -> Path:
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        "check_for_update_on_startup = false\n"
        'model = "mock-model"\n'
        'model_provider = "mock"\n\n'
        "[model_providers.mock]\n"
        'name = "mock"\n'
        f'base_url = "{base_url}"\n'
        'wire_api = "responses"\n'
        'env_key = "MOCK_API_KEY"\n'
        f"{extra}\n"
        "[analytics]\nenabled = false\n\n"
        "[feedback]\nenabled = false\n"
    )
    return codex_home


def test_ctxbudget_from_claude_code_and_codex_is_answered_by_the_proxy(
    tmp_path: Path, standin: StandIn, agents: dict[str, str]
) -> None:
    """`claude -p "/ctxbudget"` (Claude Code sends an unknown slash command to the model,
    with reminders beside it in the same message) and `codex exec "/ctxbudget full"` get
    the proxy's report; nothing reaches the upstream."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / "CLAUDE.md").write_text(CLAUDE_MD)
    with serve(tmp_path, standin_config(tmp_path, standin)) as server:
        env = _claude_env(agents, home, server.root)
        out = _claude(agents, "/ctxbudget", env=env, cwd=work, args=["--no-session-persistence"])
        codex_home = _codex_home(home, server.base_url)
        env = _env(agents, home) | {"CODEX_HOME": str(codex_home), "MOCK_API_KEY": "sk-test"}
        last = tmp_path / "last.txt"
        argv = [agents["CODEX"], "exec", "--skip-git-repo-check", "-o", str(last)]
        done = _run([*argv, "/ctxbudget full"], env=env, cwd=work, timeout=60)
    assert done.returncode == 0, _describe(done)
    assert [r.path for r in standin.received if r.path != "/v1/messages/count_tokens"] == []
    assert out["result"].startswith("📉 ctxbudget ")
    assert "Context budget: ON" in out["result"] and "More: /context budget full" in out["result"]
    report = last.read_text()
    assert report.startswith("📉 ctxbudget ") and "Effective caps (UTF-16 chars):" in report
    assert "- tool output: 16,000 per result" in report


def _agents_md(body: dict[str, Any]) -> tuple[int, str]:
    """(item index, text) of Codex's AGENTS.md part (the first part of its first user item)."""
    (found,) = [
        (i, item["content"][0]["text"])
        for i, item in enumerate(body["input"])
        if item.get("role") == "user"
        and item["content"][0]["text"].startswith("# AGENTS.md instructions for ")
    ]
    return found


def test_codex_session_is_clamped_through_the_proxy(
    tmp_path: Path, standin: StandIn, agents: dict[str, str]
) -> None:
    """A real Codex session in a workspace with a 30,000-char AGENTS.md: `cat` of a short
    file, then a command that prints 24 KB (Codex itself keeps ~10 K chars of it, so the
    tool-output cap is set to 4,000 here). Every request has its AGENTS.md clamped to the
    bootstrap cap, the long output cut to the tool-output cap, nothing else changed; every
    stream reaches Codex byte for byte. Codex is set to try the Responses WebSocket first
    (`supports_websockets`): refused with 426 once, it goes on over HTTP at once."""
    cap = 4000
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    agents_md = ("# Agents\n\n" + RULES)[:30_000]
    (work / "AGENTS.md").write_text(agents_md)
    (work / "note.txt").write_text(SECRET + "\n")
    standin.script = [
        ("exec_command", {"cmd": f"cat {work / 'note.txt'}"}),
        ("exec_command", {"cmd": "seq 1 5000"}),
    ]
    config = standin_config(tmp_path, standin)
    config["agents"]["defaults"]["contextBudget"]["toolOutputMaxChars"] = cap
    with serve(tmp_path, config) as server, Tap(server.port) as tap:
        codex_home = _codex_home(home, f"{tap.root}/v1", "supports_websockets = true\n")
        env = _env(agents, home) | {"CODEX_HOME": str(codex_home), "MOCK_API_KEY": "sk-test"}
        last = tmp_path / "last.txt"
        # No sandbox: the commands are harmless, and bubblewrap needs user namespaces.
        argv = [agents["CODEX"], "exec", "--skip-git-repo-check", "-s", "danger-full-access"]
        argv += ["-o", str(last), "Read note.txt, then count to 5000"]
        done = _run(argv, env=env, cwd=work, timeout=60)
        recent = _recent(server, 3)
    assert done.returncode == 0, _describe(done)

    upgrades = [e for e in tap.exchanges() if e.method == "GET"]
    assert [(e.target, e.status) for e in upgrades] == [("/v1/responses", 426)]
    assert json.loads(upgrades[0].response_body)["error"]["code"] == "websocket_not_supported"
    pairs = _pairs(tap, standin)
    assert [(r.method, r.path) for _, r in pairs] == [("POST", "/v1/responses")] * 3
    path = f"{work}/AGENTS.md"
    for exchange, received in pairs:
        _same_headers(exchange, received)
        sent, got = json.loads(exchange.request_body), received.json
        at, before = _agents_md(sent)
        after = _agents_md(got)[1]
        opening = f"# AGENTS.md instructions for {work}\n\n<INSTRUCTIONS>\n"
        assert before == f"{opening}{agents_md}\n</INSTRUCTIONS>"
        assert after.startswith(opening) and after.endswith("\n</INSTRUCTIONS>")
        body = after[len(opening) : -len("\n</INSTRUCTIONS>")]
        assert u16(body) <= CAP and body.startswith("# Agents\n\nRule 0:")
        assert f"read {path} for full content" in body and agents_md.endswith(body[-300:])
        got["input"][at]["content"][0]["text"] = before
        outputs = {i["call_id"]: i for i in got["input"] if i["type"] == "function_call_output"}
        for item in sent["input"]:
            if item["type"] != "function_call_output":
                continue
            mine = outputs[item["call_id"]]
            if SECRET in item["output"]:
                assert mine["output"] == item["output"]  # a short output: as it came
            else:
                assert u16(mine["output"]) <= cap < u16(item["output"])
                assert mine["output"].startswith(item["output"][:100])
                assert mine["output"].endswith("4999\n5000\n")
                mine["output"] = item["output"]
        assert got == sent
    final = pairs[-1][1].json["input"][-1]
    assert last.read_text().strip() == _said("exec_command", final["output"])
    session = pairs[0][1].headers["session-id"]
    for _, received in pairs:  # what Codex 0.169.0 sends (OPENCLAW_WIRE_FORMATS.md §7)
        assert received.headers["session-id"] == session
        assert received.headers["authorization"] == "Bearer sk-test"
        assert json.loads(received.headers["x-codex-turn-metadata"])["session_id"] == session
        assert received.json["prompt_cache_key"] == session
        assert received.json["client_metadata"]["session_id"] == session
    assert {r["session"] for r in recent} == {session}
    for row in recent:
        (boot,) = [s for s in row["segments"] if s["kind"] == "bootstrap"]
        assert (boot["label"], boot["action"]) == (path, "clamped") and boot["after"] <= CAP
    (output,) = [s for s in recent[2]["segments"] if s["kind"] == "tool_output"]
    assert output["tool"] == "exec_command" and output["after"] <= cap
