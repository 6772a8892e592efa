"""`ctxbudget demo`: the proxy in front of the built-in upstream, a sample OpenClaw session
replayed through it, the report printed, then served until Ctrl-C.

    proxy (127.0.0.1:PORT, the caps on) ─► demo upstream (127.0.0.1, any free port)
       ▲
       └── the sample session (`sample-session.json`), replayed as OpenClaw sends it

Everything the demo writes — its config, report and memories — is in a temporary directory,
removed when it stops: it never reads or writes `~/.ctxbudget`, `./ctxbudget.jsonc` or a
`database.url`, ignores `$CTXBUDGET_*` and `$OTEL_*`, and sends no key anywhere (its upstream
is on this machine and answers itself).

Its memory routes take an admin key drawn at random for the run and printed with its URL:
the port is open to every local user and process, and without a key any of them could add
memories that the demo then injects into what the user sends through it (issue 35).
"""

from __future__ import annotations

import json
import secrets
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

import httpx
import uvicorn

from ctxbudget.proxy.access.connections import GuardedHTTP
from ctxbudget.proxy.config.schema import LimitsConfig
from ctxbudget.proxy.demo.upstream import create_upstream
from ctxbudget.proxy.routes.websocket import Refusal

DEFAULT_PORT = 4141
"""The port `serve` uses: the README's examples work against the demo too. When it is taken
and no `--port` was given, any free port."""
MEMORY = "The release deadline moved to Friday the 28th, after the design review"
"""The memory the demo adds, as `ctxbudget memory add` would: recall injects it (a cost the
report counts against the savings)."""
SESSION = "sample-session.json"
ADMIN_KEY_ENV = "CTXBUDGET_ADMIN_KEY"
"""Where the demo's config finds its admin key: in the demo's own environment, which holds
nothing else (the user's `$CTXBUDGET_ADMIN_KEY` is not read)."""


def sample_requests() -> list[dict[str, Any]]:
    """The bundled session's requests, in order, as OpenClaw 9.x sends them (streamed)."""
    data = json.loads(
        (resources.files("ctxbudget.proxy.demo") / SESSION).read_text(encoding="utf-8")
    )
    return [
        {
            "model": data["model"],
            "messages": [*data["history"][:end], data["internal"]],
            "tools": data["tools"],
            "tool_choice": "auto",
            "max_completion_tokens": 4096,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        for end in data["requests"]
    ]


def demo_config(tmp: Path, upstream: str, port: int) -> dict[str, Any]:
    """The demo's config: the caps on, everything in `tmp`, the built-in upstream, no key."""
    return {
        "proxy": {
            "host": "127.0.0.1",
            "port": port,
            "upstream": {"baseUrl": upstream, "apiKeyEnv": None},
            "adminKeyEnv": ADMIN_KEY_ENV,
            # Claude Code's and Codex's formats go to the same stand-in, never to a provider
            "anthropic": {"baseUrl": upstream.removesuffix("/v1"), "apiKeyEnv": None},
        },
        "agents": {"defaults": {"contextBudget": {"enabled": True}}},
        "report": {"path": str(tmp / "report.db")},
        "memory": {"store": {"path": str(tmp / "memory.db")}},
    }


class PortInUse(Exception):
    """The port asked for is taken."""


def bind(port: int) -> socket.socket:
    """A socket listening-ready on 127.0.0.1:`port` (0: any free one); `PortInUse`."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as exc:
        sock.close()
        raise PortInUse(f"port {port} on 127.0.0.1 is in use") from exc
    return sock


@contextmanager
def serving(app: Any, sock: socket.socket, *, guarded: bool = False) -> Iterator[int]:
    """Serve `app` on `sock` with uvicorn in a thread; yield its port; stop it after.
    `guarded`: with `serve`'s HTTP protocol (`proxy.limits`' defaults: slow clients cut, a
    request the parser refuses answered in the path's wire format, not uvicorn's plain text)."""
    http: Any = GuardedHTTP(LimitsConfig()) if guarded else "auto"
    config = uvicorn.Config(
        app, log_level="warning", timeout_graceful_shutdown=2, ws=Refusal, http=http
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="ctxbudget-demo", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the demo's server did not start")
        time.sleep(0.01)
    try:
        yield int(sock.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def replay(root: str, admin_key: str) -> None:
    """Add the demo's memory (with its admin key), then send the sample session through the
    proxy at `root`."""
    with httpx.Client(base_url=root, timeout=60) as client:
        added = client.post(
            "/v1/memories",
            json={"text": MEMORY, "category": "fact"},
            headers={"authorization": f"Bearer {admin_key}"},
        )
        added.raise_for_status()
        for body in sample_requests():
            with client.stream("POST", "/v1/chat/completions", json=body) as r:
                r.raise_for_status()
                r.read()


def run_demo(
    port: int | None,
    *,
    out: TextIO,
    err: TextIO,
    stop: threading.Event | None = None,
    serve_only: bool = False,
) -> None:
    """Run the demo on `port` (None: 4141, else any free port) until `stop` is set, or
    Ctrl-C / SIGTERM when it is not given. `serve_only` (`demo --serve`): no sample session,
    the report starts empty, and what is printed is where to point your own agent."""
    from ctxbudget.proxy.app import create_app
    from ctxbudget.proxy.config.schema import ConfigSource

    try:
        sock = bind(DEFAULT_PORT if port is None else port)
    except PortInUse as exc:
        if port is not None:
            raise
        print(f"ctxbudget demo: {exc}; using any free port", file=err)
        sock = bind(0)
    stop = stop or _until_signalled()
    with tempfile.TemporaryDirectory(prefix="ctxbudget-demo-") as name:
        tmp = Path(name)
        with serving(create_upstream(), bind(0)) as upstream_port:
            upstream = f"http://127.0.0.1:{upstream_port}/v1"
            config = tmp / "ctxbudget.jsonc"
            config.write_text(json.dumps(demo_config(tmp, upstream, sock.getsockname()[1])))
            print(
                f"ctxbudget demo: using a temporary config {config} (removed on exit; "
                "./ctxbudget.jsonc, ~/.ctxbudget and $CTXBUDGET_* are not read)",
                file=err,
            )
            admin_key = secrets.token_urlsafe(24)
            # the user's CTXBUDGET_*, OTEL_* and keys stay out
            env: dict[str, str] = {ADMIN_KEY_ENV: admin_key}
            app = create_app(ConfigSource(config, env, {}), env=env, run="demo")
            with serving(app, sock, guarded=True) as proxy_port:
                root = f"http://127.0.0.1:{proxy_port}"
                if serve_only:
                    out.write(agent_setup(root, admin_key))
                else:
                    replay(root, admin_key)
                    summary = httpx.get(f"{root}/context/budget?format=summary", timeout=30)
                    summary.raise_for_status()
                    out.write(summary.text)
                    out.write(_next_steps(root, len(sample_requests()), admin_key))
                out.flush()
                stop.wait()
    print("ctxbudget demo: stopped; its temporary files are gone", file=err)


def _next_steps(root: str, requests: int, admin_key: str) -> str:
    return (
        f"\nThat was a sample OpenClaw session ({requests} requests) through the proxy, "
        "answered by a built-in stand-in (no provider, no key).\n"
        f"The page: {root}/context/budget (open it in a browser)\n"
        f"The whole report: curl {root}/context/budget?format=text\n"
        f"Point an agent at it: base URL {root}/v1 (answers are the stand-in's)\n"
        f"Memories take this run's admin key: curl -H 'authorization: Bearer {admin_key}' "
        f"{root}/v1/memories\n"
        "Serving until Ctrl-C.\n"
    )


def agent_setup(root: str, admin_key: str) -> str:
    """What `demo --serve` prints: where to point each agent at the proxy on `root`."""
    return f"""ctxbudget demo --serve: the proxy on {root}, the caps on, in front of a built-in
stand-in that answers every request itself (no provider, no key: any key will do).
Point an agent at it, then ask it anything and see what was clamped:

OpenClaw (~/.openclaw/openclaw.json), then use the model ctxbudget/gpt-5.5:
  {{ models: {{ mode: "merge", providers: {{ ctxbudget: {{
      baseUrl: "{root}/v1", apiKey: "any", api: "openai-completions",
      models: [{{ id: "gpt-5.5", name: "GPT-5.5 via ctxbudget", contextWindow: 1050000,
                 maxTokens: 8192 }}] }} }} }} }}
  (OpenClaw on Claude: the anthropic provider with baseUrl: "{root}")
Claude Code:
  ENABLE_TOOL_SEARCH=true ANTHROPIC_BASE_URL={root} ANTHROPIC_API_KEY=any claude
Codex (~/.codex/config.toml; run it with OPENAI_API_KEY=any):
  model_provider = "ctxbudget"
  [model_providers.ctxbudget]
  name = "ctxbudget demo"
  base_url = "{root}/v1"
  wire_api = "responses"
  env_key = "OPENAI_API_KEY"
Any SDK or curl: base URL {root}/v1 (Anthropic's SDK: {root})

The page: {root}/context/budget (open it in a browser)
The whole report: curl {root}/context/budget?format=text
Memories take this run's admin key: curl -H 'authorization: Bearer {admin_key}' {root}/v1/memories
Serving until Ctrl-C.
"""


def _until_signalled() -> threading.Event:
    """An event set by Ctrl-C or SIGTERM (the main thread's signal handlers)."""
    done = threading.Event()

    def handle(signum: int, frame: object) -> None:
        done.set()

    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)
    return done
