"""The request path's own CPU cost, stage by stage, against the floor, in one process.

Replays the largest captured OpenClaw request (../shared/fixtures/openclaw; else a built one
of the same size) through the real app in-process (the ASGI app, a canned upstream, the
report store and its writer thread, SQLite memory store, budget on, no memories) and through
the floor (a bare Starlette route that reads the body and hands it to the same canned
upstream), A/B interleaved, and prints:

- CPU per request (the process's user+sys time: the report's writer thread included) of
  each, and the difference: the pipeline's own cost;
- where the request path's time goes, per stage (median wall time between the phase marks
  the pipeline records for telemetry: parse, clamp, recall/session, forward and answer);
- with --profile, the functions the path spends the most time in (cProfile, this thread);
- with --functions, the CPU each stage function takes per request (its thread's CPU time
  from call to return, children included; ~1 µs of wrapping each), after the rounds.

Sockets and uvicorn are left out on both sides (bench/overhead.py measures them); what
remains is what ctxbudget itself adds.

    .venv/bin/python bench/stages.py            # 6 rounds of 400 requests each side
    .venv/bin/python bench/stages.py --quick    # 3 rounds of 150
    .venv/bin/python bench/stages.py --profile  # and the top functions
    .venv/bin/python bench/stages.py --functions  # and each stage function's CPU
    .venv/bin/python bench/stages.py --session openclaw-chat  # a recorded session instead

With --session, a recorded agent session (`bench/sessions/`: OpenClaw in each format,
Claude Code, Codex) is replayed
in order instead of one request again and again: each request resends the one before it
plus a turn, as the agent sent them. Each replay runs in a fresh process (nothing kept from
an earlier replay), ours and the floor's interleaved, 3 processes by default (--rounds).

With --grow chat|messages, one OpenClaw conversation (`bench/_growing.py`) is grown to
--turns requests (310), each sent to ctxbudget and then to the floor, in 3 fresh processes:
the pipeline's own CPU per request around turn 30, 250 and 300 (medians of per-turn medians),
the ratio of turn 300 to turn 30 (issue 34's target: 1.3), and the cost by 25 turns.

    .venv/bin/python bench/stages.py --grow chat       # ~4 minutes
    .venv/bin/python bench/stages.py --grow messages --rounds 1 --profile  # and the functions
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._growing import BUILDERS  # noqa: E402
from ctxbudget.proxy.app import create_app  # noqa: E402
from ctxbudget.proxy.config.schema import ConfigSource  # noqa: E402
from tests.fakes import REPLIES, FakeUpstream  # noqa: E402
from tests.openclaw import load_fixtures, openclaw_request  # noqa: E402
from tests.replay import SESSIONS, load  # noqa: E402

STAGES = (
    ("read + parse", "start", "parsed"),
    ("clamp", "parsed", "clamped"),
    ("session + prune", "clamped", "recall_start"),
    ("recall + observe", "recall_start", "recall_end"),
    ("headers + record", "recall_end", "upstream_start"),
    ("forward + answer", "upstream_start", "end"),
)


def capture(small: bool = False) -> tuple[str, bytes]:
    if small:  # the fixed cost: what any request pays
        body: dict[str, Any] = {
            "model": "gpt-4o",
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"},
            ],
        }
        return "a 2-message request", json.dumps(body).encode()
    found = load_fixtures()
    if found:
        name, body = max(found, key=lambda p: len(json.dumps(p[1])))
    else:
        name, body = "built-186k", openclaw_request(version="9.x", size_bytes=186_000)
    body = {**body, "stream": False}
    body.pop("stream_options", None)
    return name, json.dumps(body, ensure_ascii=False).encode()


def bench_app(
    upstream: FakeUpstream,
    *,
    holdout: float = 0.0,
    pruning: dict[str, Any] | None = None,
    clock: Any = time.time,
) -> tuple[Any, Path]:
    """The real app on `upstream`, budget on (`pruning`: its `contextPruning`; `clock`: the
    app's, a simulated one to drive the cache's lifetime), its stores in a new temporary
    folder (returned): never ~/.ctxbudget."""
    tmp = Path(tempfile.mkdtemp(prefix="ctxbudget-bench-"))
    budget: dict[str, Any] = {"enabled": True}
    if holdout:
        budget["holdout"] = holdout
    defaults: dict[str, Any] = {"contextBudget": budget}
    if pruning is not None:
        defaults["contextPruning"] = pruning
    config = {
        "agents": {"defaults": defaults},
        "memory": {"store": {"path": str(tmp / "memory.db")}},
        "report": {"path": str(tmp / "report.db")},
    }
    (tmp / "ctxbudget.json").write_text(json.dumps(config))
    source = ConfigSource(tmp / "ctxbudget.json", {}, {})
    return create_app(source, upstream=upstream, env={}, run="bench", clock=clock), tmp


def floor_app(upstream: FakeUpstream) -> Starlette:
    async def forward(request: Request) -> Response:
        body = await request.body()
        reply = await upstream.request(
            "POST",
            f"http://upstream.test{request.url.path}",
            body=body,
            headers={"content-type": "application/json"},
            connect_timeout=5,
            read_timeout=5,
        )
        return Response(await reply.read(), status_code=reply.status)

    paths = ("/v1/chat/completions", "/v1/messages", "/v1/responses")
    return Starlette(routes=[Route(path, forward, methods=["POST"]) for path in paths])


class Marks:
    """A report sink keeping each request's phase marks (the pipeline's telemetry marks)."""

    def __init__(self) -> None:
        # the last requests' only: a list of all of them grew the heap every full GC walks
        self.seen: deque[dict[str, int]] = deque(maxlen=1000)

    def record(self, r: Any, body: dict[str, Any]) -> None:
        self.seen.append(dict(r.marks))


def writer_cpu() -> float:
    """CPU seconds the report's writer thread has used so far (Linux)."""
    for thread in threading.enumerate():
        if thread.name == "ctxbudget-report" and thread.ident is not None:
            return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return 0.0


async def run(app: Any, upstream: FakeUpstream, raw: bytes, n: int) -> float:
    """CPU seconds per request for `n` requests (after the app's report is flushed)."""
    return await run_each(app, upstream, [raw] * n) / n


STAGE_FUNCTIONS = (
    ("ctxbudget.proxy.pipeline.stages", "Pipeline.handle"),
    ("ctxbudget.proxy.pipeline.stages", "Pipeline._receive"),
    ("ctxbudget.proxy.wire.body", "read_body"),
    ("ctxbudget.proxy.pipeline.offload", "Offload.takes"),
    ("ctxbudget.proxy.wire.conversations", "Conversations.find"),
    ("ctxbudget.proxy.wire.history", "kept_items"),
    ("ctxbudget.proxy.wire.history", "extends"),
    ("ctxbudget.proxy.wire.chat", "ChatCompletions.parse"),
    ("ctxbudget.proxy.wire.messages", "AnthropicMessages.parse"),
    ("ctxbudget.proxy.wire.body", "JsonBody._items_parsed"),
    ("ctxbudget.proxy.cache.resent", "Resent.parse"),
    ("ctxbudget.proxy.wire.conversations", "Conversations.remember"),
    ("ctxbudget.proxy.wire.chat", "ChatCompletionsRequest.user_turn"),
    ("ctxbudget.proxy.pipeline.stages", "Pipeline._prepare"),
    ("ctxbudget.proxy.pipeline.stages", "Pipeline._change"),
    ("ctxbudget.proxy.pipeline.holdout", "HoldoutStage.draw"),
    ("ctxbudget.proxy.wire.types", "InProcessRequest.client_prefix"),
    ("ctxbudget.proxy.pipeline.stages", "Pipeline._clamp"),
    ("ctxbudget.proxy.wire.chat", "ChatCompletionsRequest.clamp"),
    ("ctxbudget.proxy.wire.messages", "MessagesRequest.clamp"),
    ("ctxbudget.proxy.wire.chat", "resumed"),
    ("ctxbudget.caps.resume", "extend"),
    ("ctxbudget.caps.resume", "segments"),
    ("ctxbudget.proxy.wire.chat", "ChatCompletionsRequest.blocks"),
    ("ctxbudget.proxy.wire.messages", "MessagesRequest.blocks"),
    ("ctxbudget.proxy.wire.types", "paired"),
    ("ctxbudget.proxy.cache.prefix", "ClientPrefix.__init__"),
    ("ctxbudget.proxy.cache.sessions", "session_key"),
    ("ctxbudget.proxy.pipeline.prune", "PruneStage.run"),
    ("ctxbudget.proxy.pipeline.work", "Here.prune"),
    ("ctxbudget.caps.clamp", "prune_request"),
    ("ctxbudget.proxy.wire.messages", "MessagesRequest._clamp_changed"),
    ("ctxbudget.proxy.wire.pruned", "second_pass"),
    ("ctxbudget.caps.prune", "carry"),
    ("ctxbudget.caps.prune", "applied"),
    ("ctxbudget.proxy.pipeline.prune", "_undecided"),
    ("ctxbudget.proxy.pipeline.stages", "Pipeline._recall"),
    ("ctxbudget.proxy.cache.sessions", "SessionTracker.placed_memory"),
    ("ctxbudget.proxy.pipeline.recall", "RecallStage.inject"),
    ("ctxbudget.proxy.cache.sessions", "SessionTracker.observe"),
    ("ctxbudget.proxy.cache.sessions", "_made"),
    ("ctxbudget.proxy.cache.sessions", "_moved"),
    ("ctxbudget.proxy.cache.mirrors", "Mirrors.observe"),
    ("ctxbudget.proxy.cache.mirrors", "mirror_groups"),
    ("ctxbudget.proxy.cache.mirrors", "SessionMirror.observe_groups"),
    ("ctxbudget.proxy.cache.layout", "lay_out"),
    ("ctxbudget.proxy.cache.mirror", "AnthropicMirror.bill_parts"),
    ("ctxbudget.proxy.cache.mirror", "OpenAIMirror.bill_parts"),
    ("ctxbudget.proxy.pipeline.work", "Here.tally"),
    ("ctxbudget.proxy.pipeline.stages", "Pipeline._send"),
    ("ctxbudget.proxy.wire.chat", "ChatCompletionsRequest.encode"),
    ("ctxbudget.proxy.wire.messages", "MessagesRequest.encode"),
    ("ctxbudget.proxy.wire.body", "JsonBody._spliced"),
    ("ctxbudget.proxy.wire.chat", "ChatCompletions.upstream_headers"),
    ("ctxbudget.proxy.pipeline.stages", "Pipeline._forward"),
    ("ctxbudget.proxy.pipeline.relay", "read_whole"),
    ("ctxbudget.proxy.pipeline.relay", "Recorder.finish_priced"),
    ("ctxbudget.proxy.report.record", "billing_is_quick"),
    ("ctxbudget.proxy.report.record", "billing"),
    ("ctxbudget.proxy.cache.mirrors", "MirrorView.exact"),
    ("ctxbudget.proxy.pipeline.headers", "budget_headers"),
    ("ctxbudget.proxy.pipeline.headers", "money_headers"),
    # the report's writer thread (its CPU is the writer's, not the request path's)
    ("ctxbudget.proxy.report.store", "ReportStore._take"),
    ("ctxbudget.proxy.report.record", "entry_and_text"),
    ("ctxbudget.proxy.report.metrics", "Metrics.record"),
    ("ctxbudget.proxy.report.store", "ReportStore._store"),
    ("ctxbudget.proxy.report.store", "ReportStore._add_totals"),
    ("ctxbudget.proxy.report.store", "ReportStore._add_sessions"),
)
"""What --functions times (module, attribute path), in the order of a request."""


def time_functions(spent: dict[str, int]) -> None:
    """Wrap each of `STAGE_FUNCTIONS` to add its thread CPU ns to `spent`, by name."""
    import importlib
    import inspect

    for module_name, path in STAGE_FUNCTIONS:
        owner: Any = importlib.import_module(module_name)
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        original = inspect.getattr_static(owner, name)
        spent.setdefault(path, 0)

        def timed(original: Any = original, path: str = path) -> Any:
            if inspect.iscoroutinefunction(original):

                async def wrapper(*args: Any, **kwargs: Any) -> Any:
                    start = time.thread_time_ns()
                    try:
                        return await original(*args, **kwargs)
                    finally:
                        spent[path] += time.thread_time_ns() - start

                return wrapper

            def plain(*args: Any, **kwargs: Any) -> Any:
                start = time.thread_time_ns()
                try:
                    return original(*args, **kwargs)
                finally:
                    spent[path] += time.thread_time_ns() - start

            return plain

        wrapped = timed()
        setattr(owner, name, wrapped)
        if not outer:  # imported by name elsewhere: those names too
            for module in list(sys.modules.values()):
                if getattr(module, name, None) is original:
                    setattr(module, name, wrapped)


def session_bodies(name: str) -> tuple[str, list[bytes]]:
    """A recorded session's route and request bodies, in order, answered whole (not
    streamed)."""
    session = load(SESSIONS / f"{name}.jsonl.xz")
    bodies = []
    for recorded in session.requests:
        body = {**recorded.json, "stream": False}
        body.pop("stream_options", None)
        bodies.append(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode())
    return session.requests[0].path, bodies


async def replay_once(
    app: Any, floor: Any, ours_up: Any, floor_up: Any, route: str, bodies: list[bytes]
) -> None:
    """One replay of `bodies` through each side, printed as `ours floor` CPU seconds."""
    ours = await run_each(app, ours_up, bodies, route)
    bare = await run_each(floor, floor_up, bodies, route)
    print(f"{ours:.6f} {bare:.6f}")


async def run_each(
    app: Any, upstream: FakeUpstream, bodies: list[bytes], route: str = "/v1/chat/completions"
) -> float:
    """CPU seconds for `bodies`, one request each, in order (the report flushed at the end)."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        start = time.process_time()
        for body in bodies:
            await post_one(client, upstream, route, body)
        flush(app)
        return time.process_time() - start


async def post_one(
    client: httpx.AsyncClient,
    upstream: FakeUpstream,
    route: str,
    body: bytes,
    reply: dict[str, Any] | None = None,
    pruned: list[int] | None = None,
) -> None:
    """One request answered whole by the canned upstream (`reply`, else `REPLIES`);
    `pruned`: where the number of pruned results it forwarded is appended."""
    upstream.answer_json(reply or REPLIES[route])
    r = await client.post(route, content=body, headers=HEADERS[route])
    if r.status_code != 200:
        raise SystemExit(f"{r.status_code}: {r.text[:300]}")
    if pruned is not None:
        sent = bytes(upstream.sent[-1].body or b"")
        pruned.append(sent.count(b"tool result pruned") + sent.count(b"content cleared]"))
    # the canned upstream keeps what it was sent: a new 186 KB body a request grew
    # ctxbudget's heap (the floor sends the client's own bytes), and every request
    # paid ~45 page faults (~0.15 ms here) that no real upstream costs
    upstream.sent.clear()
    upstream.replies.clear()
    # in-process nothing waits on a socket: without a turn of the loop between
    # requests, the tasks a request leaves to end (its cancelled disconnect watcher)
    # would wait for the bench's end, and every later request's GC walk them
    await asyncio.sleep(0)


def flush(app: Any) -> None:
    """Wait for the report's writer thread (its CPU is the pipeline's too)."""
    state = getattr(app.state, "proxy", None)
    if state is not None:
        state.reports.flush()


HEADERS = {
    "/v1/chat/completions": {"content-type": "application/json"},
    "/v1/messages": {"content-type": "application/json", "anthropic-version": "2023-06-01"},
    "/v1/responses": {"content-type": "application/json"},
}


def sessions_main(name: str, rounds: int) -> None:
    """`--session`: `rounds` fresh processes, each replaying the session once."""
    import subprocess

    n = len(session_bodies(name)[1])
    diffs = []
    for _ in range(rounds):
        out = subprocess.run(
            [sys.executable, __file__, "--session-once", name],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        ours, bare = float(out[-2]), float(out[-1])
        diffs.append((ours - bare) / n)
        print(
            f"  replay: ctxbudget {ours / n * 1e3:.3f} ms, floor {bare / n * 1e3:.3f} ms a request"
        )
    mid = statistics.median
    print(
        f"{name}: {n} requests; the pipeline's own cost {mid(diffs) * 1e3:.3f} ms a request, "
        f"p50 of {rounds} replays ({min(diffs) * 1e3:.3f}–{max(diffs) * 1e3:.3f})"
    )


GROW_WINDOWS = ((25, 35), (245, 255), (295, 305))
"""The turns whose median CPU `--grow` shows: around turn 30, 250 (the last before the body
passes 1 MiB and the offload worker takes it) and 300; the first and last are compared."""


async def grow_once(
    app: Any, floor: Any, ours_up: Any, floor_up: Any, fmt: str, turns: int, marks: Marks
) -> None:
    """`--grow-once`: one conversation of `turns` requests through each side, interleaved
    request by request; prints each request's `ours floor` CPU seconds as JSON."""
    route, build = BUILDERS[fmt]
    bodies = build(turns)
    out = []
    ours_t = httpx.ASGITransport(app=app)
    floor_t = httpx.ASGITransport(app=floor)
    base = "http://127.0.0.1"
    async with (
        httpx.AsyncClient(transport=ours_t, base_url=base) as ours,
        httpx.AsyncClient(transport=floor_t, base_url=base) as bare,
    ):
        offloaded = 0
        for body in bodies:
            reply = sized_reply(route, len(body))
            worker = worker_cpu(app)
            start = time.process_time()
            await post_one(ours, ours_up, route, body, reply)
            flush(app)
            mid = time.process_time()
            spent = worker_cpu(app) - worker
            offloaded += spent > 0
            await post_one(bare, floor_up, route, body, reply)
            out.append((mid - start + spent, time.process_time() - mid))
    print(f"{offloaded} of {len(bodies)} requests used the offload worker", file=sys.stderr)
    records = list(marks.seen)[-turns:]
    for a, b in GROW_WINDOWS:
        if b > turns:
            continue
        spans = []
        for label, first, last in STAGES:
            found = [
                (r[last] - r[first]) / 1e6 for r in records[a - 1 : b] if first in r and last in r
            ]
            if found:
                spans.append(f"{label} {statistics.median(found):.2f}")
        print(f"turns {a}–{b}, wall ms a stage: " + ", ".join(spans), file=sys.stderr)
    print(json.dumps(out))


def worker_cpu(app: Any) -> float:
    """CPU seconds the app's offload worker process has used so far (Linux: its threads'
    run time in ns, `/proc/<pid>/task/*/schedstat`); 0 without one. A body past 1 MiB, or
    past 4,096 objects, is parsed and clamped there: its CPU is the request's too."""
    pid = app.state.offload.pid
    if pid is None:
        return 0.0
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


def sized_reply(route: str, size: int) -> dict[str, Any]:
    """`REPLIES[route]` with a prompt the size of the request (4 bytes a token, all but the
    last 2,000 tokens read from the cache), as a provider counts it: the cache mirror sets its
    scale from each answer, and a fixed count moved every prefix it holds on every request."""
    tokens = size // 4
    cached = max(tokens - 2_000, 0)
    reply = dict(REPLIES[route])
    if route == "/v1/messages":
        usage = {"input_tokens": tokens - cached, "output_tokens": 5,
                 "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}  # fmt: skip
    elif route == "/v1/responses":
        usage = {"input_tokens": tokens, "output_tokens": 5, "total_tokens": tokens + 5,
                 "input_tokens_details": {"cached_tokens": cached}}  # fmt: skip
    else:
        usage = {"prompt_tokens": tokens, "completion_tokens": 5,
                 "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip
    reply["usage"] = usage
    return reply


def grow_main(fmt: str, rounds: int, turns: int, profile: bool) -> None:
    """`--grow`: `rounds` fresh processes, each growing the conversation once; the pipeline's
    own CPU per request (ours − floor, per turn the median of the rounds) around turn 30 and
    turn 300, and their ratio."""
    import subprocess

    runs = []
    for _ in range(rounds):
        extra = ["--profile"] if profile else []
        done = subprocess.run(
            [sys.executable, __file__, "--grow-once", fmt, "--turns", str(turns), *extra],
            check=True,
            capture_output=True,
            text=True,
        )
        runs.append(json.loads(done.stdout.splitlines()[-1]))
        for line in done.stderr.strip().splitlines()[-3:]:
            print(f"  {line}")
    mid = statistics.median
    own = [mid(run[i][0] - run[i][1] for run in runs) for i in range(turns)]
    floor = [mid(run[i][1] for run in runs) for i in range(turns)]
    sizes = [len(b) for b in BUILDERS[fmt][1](turns)]
    print(f"{fmt}: one conversation of {turns} requests, {rounds} fresh processes")
    windows = []
    for a, b in GROW_WINDOWS:
        if b > turns:
            continue
        window = own[a - 1 : b]
        windows.append(mid(window))
        print(
            f"  turns {a}–{b} ({sizes[a - 1] // 1000}–{sizes[b - 1] // 1000} KB): the pipeline's "
            f"own CPU {mid(window) * 1e3:.3f} ms a request "
            f"(floor {mid(floor[a - 1 : b]) * 1e3:.3f} ms)"
        )
    if len(windows) == len(GROW_WINDOWS):
        print(f"  ratio turn 300 / turn 30: {windows[-1] / windows[0]:.2f}")
    curve = [
        f"{a + 1}–{a + 25}: {mid(own[a : a + 25]) * 1e3:.2f}" for a in range(0, turns - 24, 25)
    ]
    print("  the pipeline's own CPU by turns (ms, medians): " + ", ".join(curve))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--holdout", type=float, default=0.0, help="contextBudget.holdout (the arm's lookup)"
    )
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--rounds", type=int, default=0)
    parser.add_argument("--sort", default="tottime", help="cProfile order (with --profile)")
    parser.add_argument("--top", type=int, default=30, help="functions shown (with --profile)")
    parser.add_argument("--functions", action="store_true", help="each stage function's CPU")
    parser.add_argument("--session", help="replay this recorded chat session instead")
    parser.add_argument("--small", action="store_true", help="a 2-message request instead")
    parser.add_argument("--session-once", help=argparse.SUPPRESS)
    parser.add_argument(
        "--grow", choices=sorted(BUILDERS), help="grow one OpenClaw conversation instead"
    )
    parser.add_argument("--turns", type=int, default=310, help="its requests (with --grow)")
    parser.add_argument("--grow-once", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.session:
        return sessions_main(args.session, args.rounds or 3)
    if args.grow:
        return grow_main(args.grow, args.rounds or 3, args.turns, args.profile)
    rounds, n = (3, 150) if args.quick else (6, 400)
    if args.rounds:
        rounds = args.rounds
    name, raw = capture(args.small)
    ours_upstream, floor_upstream = FakeUpstream(), FakeUpstream()
    app, tmp = bench_app(ours_upstream, holdout=args.holdout)
    floor = floor_app(floor_upstream)
    marks = Marks()
    app.state.proxy.reports.sinks.append(marks)
    print(f"{name}: {len(raw):,} bytes, budget on, no memories; {rounds} rounds of {n}")
    async with app.router.lifespan_context(app):
        await run(app, ours_upstream, raw, 50)  # warm: caches, litellm's price map, SQLite
        await run(floor, floor_upstream, raw, 50)
        if args.session_once:
            route, bodies = session_bodies(args.session_once)
            for encoding in ("o200k_base", "cl100k_base"):  # loaded once a process (~0.6 s)
                app.state.proxy.tokens.count("warm", encoding)
            import ctxbudget.proxy.tokens as _t

            print("loaded", list(_t._encodings), file=sys.stderr)
            return await replay_once(app, floor, ours_upstream, floor_upstream, route, bodies)
        if args.grow_once:
            for encoding in ("o200k_base", "cl100k_base"):  # loaded once a process (~0.6 s)
                app.state.proxy.tokens.count("warm", encoding)
            grow = grow_once(
                app, floor, ours_upstream, floor_upstream, args.grow_once, args.turns, marks
            )
            if not args.profile:
                return await grow
            profile = cProfile.Profile()
            profile.enable()
            await grow
            profile.disable()
            profile.dump_stats(str(tmp / "grow.prof"))
            stats = pstats.Stats(profile, stream=sys.stderr).sort_stats(args.sort)
            stats.print_stats(args.top)
            print(f"profile: {tmp / 'grow.prof'}", file=sys.stderr)
            return None
        ours, bare, writer = [], [], []
        for _ in range(rounds):
            before = writer_cpu()
            ours.append(await run(app, ours_upstream, raw, n))
            writer.append((writer_cpu() - before) / n)
            bare.append(await run(floor, floor_upstream, raw, n))
        records = list(marks.seen)[-n:]
        if args.profile:
            profile = cProfile.Profile()
            profile.enable()
            await run(app, ours_upstream, raw, n)
            profile.disable()
        spent: dict[str, int] = {}
        if args.functions:  # after the rounds: the wrapping costs ~1 µs a call
            time_functions(spent)
            await run(app, ours_upstream, raw, 20)
            spent.update(dict.fromkeys(spent, 0))
            await run(app, ours_upstream, raw, n)
    mid = statistics.median
    diffs = [a - b for a, b in zip(ours, bare, strict=True)]
    print(f"  CPU per request: ctxbudget {mid(ours) * 1e3:.3f} ms, floor {mid(bare) * 1e3:.3f} ms")
    print(
        f"  the pipeline's own cost: {mid(diffs) * 1e3:.3f} ms p50 of {rounds} rounds "
        f"({min(diffs) * 1e3:.3f}–{max(diffs) * 1e3:.3f})"
    )
    print(f"  of which the report's writer thread: {mid(writer) * 1e3:.3f} ms")
    print("  wall time per stage (median of the last requests):")
    for label, a, b in STAGES:
        spans = [(r[b] - r[a]) / 1e6 for r in records if a in r and b in r]
        if spans:
            print(f"    {label:<18} {mid(spans):.3f} ms")
    if args.functions:
        print("  CPU per request in each stage function (children included):")
        for path, ns in spent.items():
            print(f"    {ns / n / 1e3:7.1f} µs  {path}")
    if args.profile:
        pstats.Stats(profile).sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    asyncio.run(main())
