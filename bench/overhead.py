"""What ctxbudget adds on top of talking to the upstream directly.

Replays OpenClaw requests (the captured ones in ../shared/fixtures/openclaw when present, else
built ones of the same size) straight to the stand-in upstream and through the proxy with the
caps on, and prints:

- added latency p50/p99 at concurrency 1 (largest request) and at concurrency 32,
- requests/s at concurrency 32, through the proxy vs direct,
- streaming time-to-first-byte added,
- proxy RSS while serving 10,000 requests,
- time from process start to the first served request.

The stand-in and this client share core 0 and the proxy gets core 1 (2-core machines), so the
proxy is never starved by its own load generator. Every measurement is repeated and the
median of the repeats is printed.

    .venv/bin/python bench/overhead.py            # full run, a few minutes
    .venv/bin/python bench/overhead.py --quick    # smaller counts, to try it out
    .venv/bin/python bench/overhead.py --telemetry  # OpenTelemetry on vs off, side by side
    .venv/bin/python bench/overhead.py --cpu        # CPU per request, proxy vs floor, only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.openclaw import format_fixtures, load_fixtures, openclaw_request  # noqa: E402

BIN = Path(sys.executable).parent


def _pin(core: int) -> Any:
    def apply() -> None:
        if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > core:
            os.sched_setaffinity(0, {core})

    return apply


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def requests() -> list[tuple[str, bytes]]:
    """(name, body) pairs, non-streaming, largest first."""
    found = load_fixtures()
    if found:
        source = "captured OpenClaw 2026.9.6 requests"
        pairs = [(name, body) for name, body in found]
    else:
        source = "built OpenClaw-shaped requests (captures absent)"
        pairs = [
            (f"built-{size // 1000}k", openclaw_request(version="9.x", size_bytes=size))
            for size in (150_000, 165_000, 180_000)
        ]
    out = []
    for name, body in pairs:
        body = {**body, "stream": False}
        body.pop("stream_options", None)
        out.append((name, json.dumps(body, ensure_ascii=False).encode()))
    out.sort(key=lambda p: -len(p[1]))
    print(f"requests: {source}: " + ", ".join(f"{n} {len(b) / 1000:.0f} KB" for n, b in out))
    return out


def start_standin() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.standin", "--port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_pin(0),
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("STANDIN_PORT="):
            return proc, f"http://127.0.0.1:{int(line.split('=')[1])}/v1"
    raise RuntimeError("stand-in did not start")


def start_proxy(
    workdir: Path, upstream: str, *, enabled: bool = True, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str, float]:
    """Start `ctxbudget serve`; return it, its URL and seconds until it served a request."""
    anthropic = {"baseUrl": upstream.removesuffix("/v1"), "apiKeyEnv": None}
    config = {
        "proxy": {
            "upstream": {"baseUrl": upstream},
            "anthropic": anthropic,
            "logLevel": "warning",
        },
        "agents": {"defaults": {"contextBudget": {"enabled": enabled}}},
        "report": {"path": str(workdir / "report.db")},
        "memory": {"store": {"path": str(workdir / "memory.db")}},  # never ~/.ctxbudget
    }
    path = workdir / "bench.jsonc"
    path.write_text(json.dumps(config))
    port = _free_port()
    url = f"http://127.0.0.1:{port}/v1"
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
    started = time.perf_counter()
    proc = subprocess.Popen(
        [str(BIN / "ctxbudget"), "serve", "--config", str(path), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_pin(1),
        env={**os.environ, **(env or {})},
    )
    import urllib.request

    while True:
        if proc.poll() is not None:
            raise RuntimeError("proxy exited during start")
        try:
            req = urllib.request.Request(
                f"{url}/chat/completions", data=body, headers={"content-type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=1) as r:
                r.read()
            break
        except OSError:
            time.sleep(0.002)
    return proc, url, time.perf_counter() - started


TUNED_MALLOC = {"MALLOC_TRIM_THRESHOLD_": str(256 << 20), "MALLOC_MMAP_THRESHOLD_": str(32 << 20)}
"""glibc settings that keep the floor's request buffers in its heap: without them it hands
each 186 KB buffer back to the kernel and faults it in again (61-163 minor faults a request,
its system time 0.3-0.55 ms), where ctxbudget's process takes ~0.2."""


def start_floor(
    upstream: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """The bare pass-through of bench/floor_app.py, on the proxy's core."""
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "floor_app:app",
            "--app-dir",
            str(ROOT / "bench"),
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        env={**os.environ, **(env or {}), "FLOOR_UPSTREAM": upstream},
        preexec_fn=_pin(1),
    )
    url = f"http://127.0.0.1:{port}/v1"
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
    asyncio.run(_until_up(url, body, proc))
    return proc, url


async def _until_up(url: str, body: bytes, proc: subprocess.Popen[bytes]) -> None:
    async with aiohttp.ClientSession() as s:
        while proc.poll() is None:
            try:
                await _one(s, url, body)
                return
            except (aiohttp.ClientError, RuntimeError):
                await asyncio.sleep(0.02)
    raise RuntimeError("floor app exited during start")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def minor_faults(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def stop(proc: subprocess.Popen[Any]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


HEADERS = {
    "content-type": "application/json",
    "x-api-key": "sk-bench",
    "authorization": "Bearer sk-bench",
}


def _endpoint(url: str) -> str:
    """A base URL (`…/v1`) means chat completions; a full endpoint is used as it is."""
    return (
        url
        if url.endswith(("/messages", "/responses", "/completions"))
        else f"{url}/chat/completions"
    )


async def _one(session: aiohttp.ClientSession, url: str, body: bytes) -> float:
    t = time.perf_counter()
    async with session.post(_endpoint(url), data=body, headers=HEADERS) as r:
        await r.read()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {await r.text()}")
    return time.perf_counter() - t


async def _ttfb(session: aiohttp.ClientSession, url: str, body: bytes) -> float:
    t = time.perf_counter()
    async with session.post(_endpoint(url), data=body, headers=HEADERS) as r:
        await r.content.readany()
        first = time.perf_counter() - t
        await r.read()
    return first


async def sequential(url: str, body: bytes, n: int, *, ttfb: bool = False) -> list[float]:
    async with aiohttp.ClientSession() as s:
        f = _ttfb if ttfb else _one
        for _ in range(20):
            await f(s, url, body)
        return [await f(s, url, body) for _ in range(n)]


async def concurrent(url: str, bodies: list[bytes], n: int, conc: int) -> tuple[float, list[float]]:
    """Requests/s and latencies for `n` requests with `conc` in flight."""
    connector = aiohttp.TCPConnector(limit=conc)
    async with aiohttp.ClientSession(connector=connector) as s:
        await asyncio.gather(*(_one(s, url, bodies[i % len(bodies)]) for i in range(conc)))
        next_i = 0
        lat: list[float] = []

        async def worker() -> None:
            nonlocal next_i
            while next_i < n:
                i = next_i
                next_i += 1
                lat.append(await _one(s, url, bodies[i % len(bodies)]))

        t = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        return n / (time.perf_counter() - t), lat


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def ms(x: float) -> str:
    return f"{x * 1000:.3f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller counts")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--telemetry", action="store_true", help="compare OpenTelemetry on vs off, nothing else"
    )
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="CPU per request of the proxy and the floor, interleaved, nothing else",
    )
    parser.add_argument(
        "--formats",
        action="store_true",
        help="added latency and TTFB per wire format (chat, Messages, Responses), nothing else",
    )
    args = parser.parse_args()
    n_seq, n_conc, n_rss = (200, 1000, 2000) if args.quick else (1000, 4000, 10_000)
    _pin(0)()
    if args.telemetry:
        telemetry_compare(args.repeats, n_seq, n_conc)
        return
    if args.formats:
        formats_compare(args.repeats, n_seq)
        return
    if args.cpu:
        cpu_compare(max(args.repeats, 5), 300 if args.quick else 1000)
        return
    bodies = requests()
    largest = bodies[0][1]
    stream_body = largest.replace(b'"stream": false', b'"stream": true', 1)

    standin, direct = start_standin()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        try:
            starts = []
            for i in range(args.repeats + 2):
                (work / f"start{i}").mkdir()
                proc, _, took = start_proxy(work / f"start{i}", direct)
                starts.append(took)
                stop(proc)
            floor, floor_url = start_floor(direct)
            proxy, url, _ = start_proxy(work, direct)
            try:
                run(
                    args.repeats,
                    direct,
                    url,
                    proxy.pid,
                    bodies,
                    largest,
                    stream_body,
                    n_seq,
                    n_conc,
                    n_rss,
                    starts,
                    (floor_url, floor.pid),
                )
            finally:
                stop(proxy)
                stop(floor)
        finally:
            stop(standin)


def run(
    repeats: int,
    direct: str,
    url: str,
    pid: int,
    bodies: list[tuple[str, bytes]],
    largest: bytes,
    stream_body: bytes,
    n_seq: int,
    n_conc: int,
    n_rss: int,
    starts: list[float],
    floor: tuple[str, int],
) -> None:
    results: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        results.setdefault(key, []).append(value)

    all_bodies = [b for _, b in bodies]
    for _ in range(repeats):
        d = asyncio.run(sequential(direct, largest, n_seq))
        p = asyncio.run(sequential(url, largest, n_seq))
        add("c1 direct p50", pct(d, 0.5))
        add("c1 proxy p50", pct(p, 0.5))
        add("c1 added p50", pct(p, 0.5) - pct(d, 0.5))
        add("c1 added p99", pct(p, 0.99) - pct(d, 0.99))
        rd, ld = asyncio.run(concurrent(direct, all_bodies, n_conc, 32))
        rp, lp = asyncio.run(concurrent(url, all_bodies, n_conc, 32))
        add("c32 direct rps", rd)
        add("c32 proxy rps", rp)
        add("c32 ratio", rp / rd)
        add("c32 added p50", pct(lp, 0.5) - pct(ld, 0.5))
        add("c32 added p99", pct(lp, 0.99) - pct(ld, 0.99))
        td = asyncio.run(sequential(direct, stream_body, n_seq // 2, ttfb=True))
        tp = asyncio.run(sequential(url, stream_body, n_seq // 2, ttfb=True))
        add("ttfb added p50", pct(tp, 0.5) - pct(td, 0.5))
        add("ttfb added p99", pct(tp, 0.99) - pct(td, 0.99))
        fl = asyncio.run(sequential(floor[0], largest, n_seq))
        add("floor added p50", pct(fl, 0.5) - pct(d, 0.5))
        add("floor added p99", pct(fl, 0.99) - pct(d, 0.99))
        for name, (target, pid_) in (("proxy", (url, pid)), ("floor", floor)):
            before = cpu_seconds(pid_)
            asyncio.run(sequential(target, largest, n_seq // 2))
            add(f"{name} cpu", (cpu_seconds(pid_) - before) / (n_seq // 2 + 20))

    rss = [rss_mb(pid)]
    for _ in range(4):
        asyncio.run(concurrent(url, all_bodies, n_rss // 4, 32))
        rss.append(rss_mb(pid))
    time.sleep(3)  # the report writer trims freed memory after 2 s without requests
    idle = rss_mb(pid)

    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"\nmedian of {repeats} repeats; proxy with contextBudget on, pinned to its own core")
    print(f"concurrency 1, largest request ({len(largest) / 1000:.0f} KB), {n_seq} requests:")
    print(f"  direct p50 {ms(med['c1 direct p50'])}, through proxy p50 {ms(med['c1 proxy p50'])}")
    print(f"  added p50 {ms(med['c1 added p50'])}   (target <= 1 ms)")
    print(f"  added p99 {ms(med['c1 added p99'])}   (target <= 5 ms)")
    print(
        f"  the floor (bench/floor_app.py: bare Starlette + aiohttp pass-through, no parse) adds"
        f" p50 {ms(med['floor added p50'])}, p99 {ms(med['floor added p99'])}"
    )
    print(f"  CPU per request: proxy {ms(med['proxy cpu'])}, floor {ms(med['floor cpu'])}")
    print(f"concurrency 32, all requests round-robin, {n_conc} requests:")
    print(
        f"  direct {med['c32 direct rps']:.0f} req/s,",
        f"through proxy {med['c32 proxy rps']:.0f} req/s",
    )
    print(f"  ratio {med['c32 ratio'] * 100:.0f}% of direct   (target >= 60%)")
    print(f"  added p50 {ms(med['c32 added p50'])}, added p99 {ms(med['c32 added p99'])}")
    print("streaming, time to first byte:")
    print(
        f"  added p50 {ms(med['ttfb added p50'])}   (target <= 1 ms),",
        f"p99 {ms(med['ttfb added p99'])}",
    )
    marks = ", ".join(f"{r:.1f}" for r in rss)
    print(
        f"proxy RSS (MB) at 0, {n_rss // 4}, ... {n_rss} requests: {marks}",
        "  (target flat, <= 100 MB)",
    )
    print(f"proxy RSS after 3 s idle: {idle:.1f} MB")
    print(
        f"start to first served request: median {statistics.median(starts) * 1000:.0f} ms "
        f"over {len(starts)} starts (min {min(starts) * 1000:.0f}, max {max(starts) * 1000:.0f})"
        "   (target <= 1 s)"
    )


def cpu_compare(repeats: int, n: int) -> None:
    """The pipeline's own CPU cost: CPU seconds per request of the proxy (contextBudget on)
    and of the floor (bench/floor_app.py), `n` sequential requests of the largest capture
    each, interleaved `repeats` times; the process's user+sys ticks, so its report writer
    thread is counted. The floor runs twice: as it is, and with glibc kept from handing its
    buffers back to the kernel (`TUNED_MALLOC`), whose page faults otherwise make it swing
    by ~0.3 ms between runs; the minor faults a request of each are printed."""
    largest = requests()[0][1]
    standin, direct = start_standin()
    names = ("proxy", "floor", "floor, no faults")
    cpu: dict[str, list[float]] = {name: [] for name in names}
    faults: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            floor, floor_url = start_floor(direct)
            tuned, tuned_url = start_floor(direct, TUNED_MALLOC)
            proxy, url, _ = start_proxy(Path(tmp), direct)
            try:
                targets = [(url, proxy.pid), (floor_url, floor.pid), (tuned_url, tuned.pid)]
                for round_ in range(repeats):
                    order = list(zip(names, targets, strict=True))
                    for name, (target, pid) in order if round_ % 2 == 0 else order[::-1]:
                        before, faulted = cpu_seconds(pid), minor_faults(pid)
                        asyncio.run(sequential(target, largest, n))
                        cpu[name].append((cpu_seconds(pid) - before) / (n + 20))
                        faults[name].append((minor_faults(pid) - faulted) / (n + 20))
            finally:
                stop(proxy)
                stop(floor)
                stop(tuned)
        finally:
            stop(standin)
    mid = statistics.median
    print(f"CPU per request, {len(largest) // 1000} KB request, {repeats} rounds of {n}:")
    for name in names:
        faulted = mid(faults[name])
        print(f"  {name:<17} {ms(mid(cpu[name]))}  ({faulted:.0f} minor faults a request)")
    notes = {"floor": "(target <= 0.5 ms)", "floor, no faults": "(the stricter floor)"}
    for name in names[1:]:
        own = [p - f for p, f in zip(cpu["proxy"], cpu[name], strict=True)]
        print(
            f"  the pipeline's own cost over the {name}: {ms(mid(own))} p50 "
            f"({ms(min(own))} - {ms(max(own))})   {notes[name]}"
        )


def format_requests() -> list[tuple[str, str, bytes]]:
    """(format, endpoint, largest captured non-streaming body) for each wire format."""
    out = []
    chat = requests()[0][1]
    out.append(("chat completions", "chat/completions", chat))
    for name, folder, endpoint in (
        ("Anthropic Messages", "openclaw-messages", "messages"),
        ("OpenAI Responses", "openclaw-responses", "responses"),
    ):
        found = format_fixtures(folder)
        if not found:
            print(f"({name}: captures absent, skipped)")
            continue
        bodies = []
        for _, raw in found:
            body = json.loads(raw)
            body["stream"] = False
            bodies.append(json.dumps(body, ensure_ascii=False).encode())
        out.append((name, endpoint, max(bodies, key=len)))
    return out


def formats_compare(repeats: int, n_seq: int) -> None:
    """Added latency (c1) and streaming TTFB per wire format, on the captured requests."""
    cases = format_requests()
    standin, direct = start_standin()
    with tempfile.TemporaryDirectory() as tmp:
        proxy, url, _ = start_proxy(Path(tmp), direct)
        try:
            results: dict[str, list[float]] = {}
            for _ in range(repeats):
                for name, endpoint, body in cases:
                    d_url, p_url = f"{direct}/{endpoint}", f"{url}/{endpoint}"
                    d = asyncio.run(sequential(d_url, body, n_seq))
                    p = asyncio.run(sequential(p_url, body, n_seq))
                    results.setdefault(f"{name} p50", []).append(pct(p, 0.5) - pct(d, 0.5))
                    results.setdefault(f"{name} p99", []).append(pct(p, 0.99) - pct(d, 0.99))
                    stream = body.replace(b'"stream": false', b'"stream": true', 1)
                    td = asyncio.run(sequential(d_url, stream, n_seq // 2, ttfb=True))
                    tp = asyncio.run(sequential(p_url, stream, n_seq // 2, ttfb=True))
                    results.setdefault(f"{name} ttfb", []).append(pct(tp, 0.5) - pct(td, 0.5))
        finally:
            stop(proxy)
            stop(standin)
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"\nmedian of {repeats} repeats, concurrency 1, {n_seq} requests each, caps on")
    print(f"{'format':<20} {'size':>7} {'added p50':>11} {'added p99':>11} {'TTFB added':>11}")
    for name, _, body in cases:
        print(
            f"{name:<20} {len(body) / 1000:>5.0f}KB {ms(med[f'{name} p50']):>11}"
            f" {ms(med[f'{name} p99']):>11} {ms(med[f'{name} ttfb']):>11}"
        )
    print("(targets: added p50 <= 1 ms, TTFB added p50 <= 1 ms, as for chat completions)")


class _Sink(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that accepts and drops everything (counts what it got)."""

    received = 0

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("content-length", 0)))
        type(self).received += 1
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def telemetry_compare(repeats: int, n_seq: int, n_conc: int) -> None:
    """Added latency, CPU and throughput of the proxy with telemetry off and on (OTLP/HTTP)."""
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    bodies = requests()
    largest = bodies[0][1]
    standin, direct = start_standin()
    otel = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink.server_address[1]}",
        "OTEL_METRIC_EXPORT_INTERVAL": "1000",
        **{k: v for k, v in os.environ.items() if k.startswith("OTEL_BSP_")},
    }
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        procs = {}
        try:
            for name, env in (("off", {}), ("on", otel)):
                (Path(tmp) / name).mkdir()
                proc, url, _ = start_proxy(Path(tmp) / name, direct, env=env)
                procs[name] = (proc, url)
            for _ in range(repeats):
                d = asyncio.run(sequential(direct, largest, n_seq))
                for name, (proc, url) in procs.items():
                    before = cpu_seconds(proc.pid)
                    p = asyncio.run(sequential(url, largest, n_seq))
                    cpu = (cpu_seconds(proc.pid) - before) / n_seq
                    rps, _ = asyncio.run(concurrent(url, [b for _, b in bodies], n_conc, 32))
                    for key, value in (
                        ("added p50", pct(p, 0.5) - pct(d, 0.5)),
                        ("added p99", pct(p, 0.99) - pct(d, 0.99)),
                        ("cpu", cpu),
                        ("rps", rps),
                    ):
                        results.setdefault(f"{name} {key}", []).append(value)
        finally:
            for proc, _ in procs.values():
                stop(proc)
            stop(standin)
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"\nOpenTelemetry off vs on (OTLP/HTTP to a local sink), median of {repeats} repeats")
    print(f"{'':>10} {'added p50':>10} {'added p99':>10} {'CPU/request':>12} {'c32 req/s':>10}")
    for name in ("off", "on"):
        print(
            f"{name:>10} {ms(med[f'{name} added p50']):>10} {ms(med[f'{name} added p99']):>10}"
            f" {ms(med[f'{name} cpu']):>12} {med[f'{name} rps']:>10.0f}"
        )
    print(
        f"on - off: added p50 {ms(med['on added p50'] - med['off added p50'])}, CPU "
        f"{ms(med['on cpu'] - med['off cpu'])} per request, throughput "
        f"{med['on rps'] / med['off rps'] * 100:.0f}% of off; the sink got {_Sink.received} exports"
    )


if __name__ == "__main__":
    main()
