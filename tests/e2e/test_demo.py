"""`ctxbudget demo` as a new user runs it (issue 23): one command, no provider, no key — the
proxy, its built-in stand-in upstream and the bundled sample session, the report printed
(net money first) with the page's URL, served until Ctrl-C, and nothing left behind."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import httpx

from ctxbudget.proxy.report.render import money
from tests.e2e.server import CTXBUDGET


def test_demo_prints_the_net_report_serves_the_page_and_leaves_nothing(tmp_path: Path) -> None:
    home, here = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    here.mkdir()
    (here / "ctxbudget.jsonc").write_text("{ this is not read")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CTXBUDGET")},
        "HOME": str(home),
        "CTXBUDGET_CONFIG": str(tmp_path / "missing.jsonc"),  # nor is this
        "OPENAI_API_KEY": "sk-must-not-be-needed",
    }
    demo = subprocess.Popen(
        [CTXBUDGET, "demo", "--port", "0"],
        cwd=here,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert demo.stdout is not None and demo.stderr is not None
    try:
        printed = []
        for line in demo.stdout:
            printed.append(line)
            if line.startswith("Serving until Ctrl-C"):
                break
        out = "".join(printed)
        assert out.startswith("📉 ctxbudget saved $"), out
        page_url = re.search(r"The page: (http://127\.0\.0\.1:\d+/context/budget)", out)
        assert page_url is not None, out
        root = page_url.group(1).removesuffix("/context/budget")
        report = httpx.get(f"{root}/context/budget", timeout=30).json()
        page = httpx.get(page_url.group(1), headers={"accept": "text/html"}, timeout=30)
        # issue 35: another local user cannot add memories; the printed key can
        memory = {"text": "from someone else on this machine"}
        anyone = httpx.post(f"{root}/v1/memories", json=memory, timeout=30)
        guessed = httpx.post(
            f"{root}/v1/memories", json=memory, headers={"x-api-key": "demo"}, timeout=30
        )
        key = re.search(
            r"Memories take this run's admin key: curl -H 'authorization: Bearer "
            r"(\S+)' " + re.escape(root) + r"/v1/memories\n",
            out,
        )
        assert key is not None, out
        listed = httpx.get(
            f"{root}/v1/memories", headers={"authorization": f"Bearer {key.group(1)}"}, timeout=30
        )
        other = _other_demo_key(tmp_path, env)
    finally:
        demo.send_signal(signal.SIGINT)
        try:
            code = demo.wait(timeout=30)
        finally:
            demo.kill()
        err = demo.stderr.read()
        demo.stdout.close()
        demo.stderr.close()

    assert code == 0, err
    totals = report["totals"]
    net = totals["money"]["savedUsd"]
    assert totals["requests"] == 4 and totals["clamped"] > 0
    assert 0 < net < totals["savedUsd"], "net of cache reads, below the gross figure"
    assert out.splitlines()[0].startswith(f"📉 ctxbudget saved {money(net)} net of cache")
    assert "Gross, before cache effects: " in out
    assert len(out.splitlines()) < 30
    assert page.status_code == 200 and "Saved, net of cache effects" in page.text
    assert money(net) in page.text
    assert report["recent"][-1]["memory"]["injected"] == 1  # recall ran: memories shown too
    # its own temporary config, said on stderr, gone afterwards; ~/.ctxbudget never made
    config = re.search(r"using a temporary config (\S+)", err)
    assert config is not None, err
    assert not Path(config.group(1)).exists()
    assert "stopped" in err
    assert not (home / ".ctxbudget").exists()
    assert report["enabled"] is True
    assert (anyone.status_code, guessed.status_code) == (401, 401)
    assert listed.status_code == 200
    assert [m["text"] for m in listed.json()["data"]] == [
        "The release deadline moved to Friday the 28th, after the design review"
    ]
    assert len(key.group(1)) >= 32 and other != key.group(1), "random, per run"


def _other_demo_key(tmp_path: Path, env: dict[str, str]) -> str:
    """The admin key another run of the demo prints (its own port, its own temporary files)."""
    run = subprocess.Popen(
        [CTXBUDGET, "demo", "--port", "0"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert run.stdout is not None
    try:
        for line in run.stdout:
            found = re.search(r"admin key: curl -H 'authorization: Bearer (\S+)'", line)
            if found:
                return found.group(1)
        raise AssertionError("the demo printed no admin key")
    finally:
        run.send_signal(signal.SIGINT)
        try:
            run.wait(timeout=30)
        finally:
            run.kill()
            run.stdout.close()


def test_demo_serve_is_an_upstream_for_your_own_agent_in_every_format(tmp_path: Path) -> None:
    """`ctxbudget demo --serve` (issue 36, item 5): the proxy in front of the built-in
    stand-in, no sample session replayed, the base URLs for OpenClaw, Claude Code and Codex
    printed; each format's request is answered by the stand-in and clamped on its way."""
    home = tmp_path / "home"
    home.mkdir()
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("CTXBUDGET", "OPENAI_", "ANTHROPIC_"))
        },
        "HOME": str(home),
    }
    demo = subprocess.Popen(
        [CTXBUDGET, "demo", "--serve", "--port", "0"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert demo.stdout is not None and demo.stderr is not None
    big = "".join(f"line {i}: build step output, nothing failed\n" for i in range(2_000))
    call = {"id": "call_1", "type": "function"}
    try:
        printed = []
        for line in demo.stdout:
            printed.append(line)
            if line.startswith("Serving until Ctrl-C"):
                break
        out = "".join(printed)
        found = re.search(r"ANTHROPIC_BASE_URL=(http://127\.0\.0\.1:\d+) ", out)
        assert found is not None, out
        root = found.group(1)
        assert f'baseUrl: "{root}/v1"' in out  # OpenClaw's openai-completions provider
        assert f'base_url = "{root}/v1"' in out  # Codex's model provider
        chat = httpx.post(
            f"{root}/v1/chat/completions",
            json={
                "model": "gpt-5.5",
                "messages": [
                    {"role": "user", "content": "build it"},
                    {
                        "role": "assistant",
                        "tool_calls": [{**call, "function": {"name": "exec", "arguments": "{}"}}],
                    },
                    {"role": "tool", "tool_call_id": "call_1", "content": big},
                ],
            },
            timeout=30,
        )
        messages = httpx.post(
            f"{root}/v1/messages",
            headers={"x-api-key": "any", "anthropic-version": "2023-06-01"},
            json={
                "model": "claude-sonnet-4-6",
                "max_tokens": 512,
                "stream": True,
                "messages": [
                    {"role": "user", "content": "build it"},
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "tool_use", "id": "tu_1", "name": "Bash", "input": {}}
                        ],
                    },
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": big}],
                    },
                ],
            },
            timeout=30,
        )
        responses = httpx.post(
            f"{root}/v1/responses",
            json={
                "model": "gpt-5-codex",
                "stream": True,
                "input": [
                    {"role": "user", "content": "build it"},
                    {
                        "type": "function_call",
                        "call_id": "fc_1",
                        "name": "exec_command",
                        "arguments": "{}",
                    },
                    {"type": "function_call_output", "call_id": "fc_1", "output": big},
                ],
            },
            timeout=30,
        )
        report = httpx.get(f"{root}/context/budget", timeout=30).json()
        # a request uvicorn's parser refuses: the demo runs `serve`'s HTTP protocol too
        # (round 36: it answered in plain text, and kept slow clients for good)
        port = int(root.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: localhost\r\nNo colon\r\n\r\n")
            refused = b""
            while chunk := sock.recv(65536):
                refused += chunk
    finally:
        demo.send_signal(signal.SIGINT)
        try:
            code = demo.wait(timeout=30)
        finally:
            demo.kill()
        err = demo.stderr.read()
        demo.stdout.close()
        demo.stderr.close()

    assert code == 0, err
    head, _, refusal = refused.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), refused[:200]
    assert json.loads(refusal)["error"]["type"] == "invalid_request_error"  # Anthropic's shape
    assert chat.status_code == 200, chat.text
    assert "stand-in answered" in chat.json()["choices"][0]["message"]["content"]
    assert messages.status_code == 200, messages.text
    assert "event: message_stop" in messages.text and "stand-in" in messages.text
    assert responses.status_code == 200, responses.text
    assert "response.completed" in responses.text and "stand-in" in responses.text
    for answer in (chat, messages, responses):
        assert answer.headers["x-context-budget-clamped"] == "1", answer.headers
    # only what was sent: no sample session replayed into the report
    assert report["totals"]["requests"] == 3
    assert not (home / ".ctxbudget").exists()
