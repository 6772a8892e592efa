"""`ctxbudget` command line.

    ctxbudget serve  [--config PATH] [--host H] [--port P] [--workers N]
    ctxbudget report [--config PATH] [--json]
    ctxbudget memory add TEXT [--category C] [--source S] [--scope SCOPE] [--owner O] [--json]
    ctxbudget memory list [--scope SCOPE] [--owner O] [--json]
    ctxbudget memory search QUERY [--owner O] [--json]
    ctxbudget memory rm ID [--owner O] [--json]
    ctxbudget analyze [--config PATH] [--days N] [--min-requests N] [--owner O] [--json]
    ctxbudget recall QUERY [--budget lean|balanced|deep|auto] [--agent NAME] [--owner O] [--json]
    ctxbudget config init [PATH] [--force]
    ctxbudget config show|check [--config PATH] [--host H] [--port P] [--json]
    ctxbudget demo [--port P] [--serve]
    ctxbudget --version

Every command takes `--config PATH` (else `$CTXBUDGET_CONFIG`, else `./ctxbudget.jsonc` or
`./ctxbudget.json`, else `~/.ctxbudget/config.jsonc`, else built-in defaults: see
`proxy/config/file.py`) and says on stderr which file it used; `demo` uses a temporary one
of its own. `--json` prints machine-readable JSON on stdout and nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import logging
import os
import secrets
import socket
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ctxbudget.memory.pg import DatabaseUnavailable
from ctxbudget.memory.profiles import REQUESTED_PROFILES
from ctxbudget.proxy.errors import ConfigError

if TYPE_CHECKING:
    from ctxbudget.proxy.config.schema import ConfigSource

# Set by `serve` for its uvicorn workers, which rebuild the app from them.
_ENV_CONFIG = "CTXBUDGET_SERVE_CONFIG"
_ENV_OVERRIDES = "CTXBUDGET_SERVE_OVERRIDES"
_ENV_RUN = "CTXBUDGET_RUN_ID"

log = logging.getLogger("ctxbudget")

FLAGS = {"proxy.host": "--host", "proxy.port": "--port"}
"""Config values a command-line flag sets, and the flag."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ctxbudget",
        description="An OpenAI-compatible proxy that clamps agent context to contextBudget caps.",
    )
    parser.add_argument("--version", action="version", version=f"ctxbudget {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the proxy (default 127.0.0.1:4141)")
    serve.add_argument("--config", metavar="PATH", help="config file (JSONC)")
    serve.add_argument("--host", help="address to listen on (proxy.host)")
    serve.add_argument("--port", type=int, help="port to listen on (proxy.port)")
    serve.add_argument(
        "--workers", type=int, default=1, help="worker processes (the report covers them all)"
    )

    report = sub.add_parser("report", help="print the /context budget report")
    report.add_argument("--config", metavar="PATH", help="config file (JSONC)")
    report.add_argument("--json", action="store_true", help="print JSON only")
    report.add_argument(
        "--since",
        metavar="WHEN",
        help="totals since then: 24h, 7d, 2w, or an ISO date/time (default: all that is kept)",
    )

    rec = sub.add_parser("recall", help="show which memories a query would recall, and why")
    rec.add_argument("query")
    rec.add_argument(
        "--budget",
        choices=REQUESTED_PROFILES,
        default=None,
        help="retrieval profile (default: memory.inject.budget)",
    )
    rec.add_argument("--agent", help="agent name (its agent:<name> memories count too)")
    rec.add_argument("--owner", default="default", help="whose memories (default: default)")
    rec.add_argument("--config", metavar="PATH", help="config file (JSONC)")
    rec.add_argument("--json", action="store_true", help="print JSON only")

    analyze = sub.add_parser("analyze", help="budget-usage recommendations")
    analyze.add_argument("--config", metavar="PATH", help="config file (JSONC)")
    analyze.add_argument("--days", type=float, default=7, help="window to analyse (default 7)")
    analyze.add_argument(
        "--min-requests",
        type=int,
        default=None,
        metavar="N",
        help="fewest requests of an agent to recommend from (default 20)",
    )
    analyze.add_argument("--owner", help="only this owner's requests")
    analyze.add_argument("--json", action="store_true", help="print JSON only")

    memory = sub.add_parser("memory", help="add, list, search and remove memories")
    actions = memory.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="add a memory")
    add.add_argument("text")
    add.add_argument("--category", default="fact", help="preference, fact, pattern, ...")
    add.add_argument("--source", default="user_explicit", help="user_explicit or inferred")
    add.add_argument("--scope", default="global", help="global or agent:<name>")
    listing = actions.add_parser("list", help="list memories")
    listing.add_argument("--scope", help="only this scope")
    search = actions.add_parser("search", help="keyword search (BM25)")
    search.add_argument("query")
    remove = actions.add_parser("rm", help="remove a memory")
    remove.add_argument("id", type=int)
    imports = actions.add_parser(
        "import", help="add memories from JSONL or Markdown (MEMORY.md): all or none"
    )
    imports.add_argument("file", help="a .jsonl export, or Markdown (- for stdin: JSONL)")
    imports.add_argument(
        "--format", choices=("auto", "jsonl", "md"), default="auto", help="default: by extension"
    )
    imports.add_argument(
        "--category",
        default="fact",
        help="category of Markdown memories under no heading that names one (## Preferences)",
    )
    exports = actions.add_parser("export", help="print memories as JSONL (what import reads)")
    exports.add_argument("--scope", help="only this scope")
    for each in (add, listing, search, remove, imports, exports):
        each.add_argument("--config", metavar="PATH", help="config file (JSONC)")
        each.add_argument("--owner", default="default", help="whose memories (default: default)")
        each.add_argument("--json", action="store_true", help="print JSON only")

    demo = sub.add_parser(
        "demo",
        help="the proxy, a built-in stand-in upstream and a sample session: no provider, no key",
    )
    demo.add_argument(
        "--port", type=int, help="port to serve on (default 4141, or any free one if taken)"
    )
    demo.add_argument(
        "--serve",
        action="store_true",
        help="no sample session: print where to point OpenClaw, Claude Code or Codex, and serve",
    )

    config = sub.add_parser(
        "config", help="write a starter config, show the one in force, check it"
    )
    verbs = config.add_subparsers(dest="action", required=True, metavar="ACTION")
    init = verbs.add_parser("init", help="write a commented starter config file")
    init.add_argument(
        "path",
        nargs="?",
        metavar="PATH",
        help="where (default: ~/.ctxbudget/config.jsonc, which every command finds)",
    )
    init.add_argument("--config", metavar="PATH", help="same as PATH")
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
    show = verbs.add_parser("show", help="the config in force, each value with where it came from")
    show.add_argument("--json", action="store_true", help="print JSON only")
    check = verbs.add_parser("check", help="validate the config in force (file, environment)")
    for each in (show, check):
        each.add_argument("--config", metavar="PATH", help="config file (JSONC)")
        each.add_argument("--host", help="as `serve --host` would (proxy.host)")
        each.add_argument("--port", type=int, help="as `serve --port` would (proxy.port)")
    return parser


def _version() -> str:
    try:
        return metadata.version("ctxbudget")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The config values set by `--host` and `--port`, as dotted paths."""
    return {
        path: getattr(args, flag[2:])
        for path, flag in FLAGS.items()
        if getattr(args, flag[2:], None) is not None
    }


def _source(config: str | None, overrides: dict[str, Any]) -> ConfigSource:
    """The config in force, after saying on stderr which file it is (stdout stays clean for
    `--json` and pipes)."""
    from ctxbudget.proxy.config.file import find_config
    from ctxbudget.proxy.config.schema import ConfigSource

    location = find_config(config, os.environ, cwd=Path.cwd(), home=Path.home())
    print(f"ctxbudget: {location.describe()}", file=sys.stderr)
    return ConfigSource(location.path, os.environ, overrides)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `ctxbudget` console script."""
    args = _parser().parse_args(argv)
    if args.command != "serve":
        # The pool's own warnings on each failed connect attempt: a command says it once, below
        logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
    try:
        if args.command == "serve":
            _serve(args)
        elif args.command == "report":
            _report(args)
        elif args.command == "memory":
            _memory(args)
        elif args.command == "analyze":
            _analyze(args)
        elif args.command == "recall":
            _recall(args)
        elif args.command == "config":
            _config(args)
        elif args.command == "demo":
            _demo(args)
    except ConfigError as exc:
        print(f"ctxbudget: config error:\n{exc.message}", file=sys.stderr)
        raise SystemExit(2) from None
    except DatabaseUnavailable as exc:
        print(f"ctxbudget: {exc} (database.url)", file=sys.stderr)
        raise SystemExit(1) from None


def _serve(args: argparse.Namespace) -> None:
    import uvicorn

    from ctxbudget.proxy.access.connections import GuardedHTTP
    from ctxbudget.proxy.report.metrics import shared_between_workers
    from ctxbudget.proxy.routes.websocket import Refusal
    from ctxbudget.proxy.urls import redact

    overrides = _overrides(args)
    if args.workers < 1:
        raise SystemExit("ctxbudget: --workers must be at least 1")
    source = _source(args.config, overrides)  # fails here, before binding, on a broken config
    cfg = source.get()
    level = cfg.proxy.log_level
    logging.basicConfig(level=level.upper(), format="%(levelname)s %(name)s: %(message)s")
    run = secrets.token_hex(6)
    _start_run(cfg, run)
    os.environ[_ENV_CONFIG] = str(source.path) if source.path else ""
    os.environ[_ENV_OVERRIDES] = json.dumps(overrides)
    os.environ[_ENV_RUN] = run
    _check_port(cfg.proxy.host, cfg.proxy.port)
    _warn_if_open(cfg)
    _warn_if_keys_without_upstream_key(cfg)
    budget = "ON" if cfg.agents.defaults.context_budget.enabled else "OFF (reporting would-clamp)"
    log.info(
        "ctxbudget %s on http://%s:%s/v1 → %s, contextBudget %s, config %s",
        "serving",
        cfg.proxy.host,
        cfg.proxy.port,
        redact(cfg.proxy.upstream.base_url),
        budget,
        source.path or "built-in defaults",
    )
    log.info("memory: %s (docs/architecture.md, Memory)", _memory_bound(cfg, args.workers))
    # uvicorn calls the protocol factory as it would its own class
    http = cast("type[asyncio.Protocol]", GuardedHTTP(cfg.proxy.limits))
    # /metrics adds up every worker's figures (prometheus_client's multiprocess mode)
    with shared_between_workers(args.workers):
        uvicorn.run(
            "ctxbudget.proxy.cli:app_factory",
            factory=True,
            host=cfg.proxy.host,
            port=cfg.proxy.port,
            workers=args.workers,
            log_level=level,
            access_log=level == "debug",
            timeout_graceful_shutdown=5,
            http=http,
            timeout_keep_alive=cfg.proxy.limits.keep_alive_timeout_seconds,
            ws=Refusal,  # every WebSocket handshake gets the app's 426, malformed ones too
        )


def _memory_bound(cfg: Any, workers: int) -> str:
    """What `serve` holds at most, by the cache registry and this config: an operator sizes
    the machine (or the container's limit) by it."""
    from ctxbudget.proxy.cache.registry import rss_bound
    from ctxbudget.proxy.config.settings import settings_for
    from ctxbudget.proxy.pipeline.worker import WORKER_RSS

    bound = rss_bound(settings_for(cfg, os.environ), cfg.proxy.limits, worker_rss=WORKER_RSS)
    return str(bound) if workers == 1 else f"{bound}; each of {workers} workers"


def _demo(args: argparse.Namespace) -> None:
    from ctxbudget.proxy.demo.run import PortInUse, run_demo

    try:
        run_demo(args.port, out=sys.stdout, err=sys.stderr, serve_only=args.serve)
    except PortInUse as exc:
        raise SystemExit(
            f"ctxbudget demo: {exc}{running_there('127.0.0.1', args.port)}: pass another "
            "--port (0: any free one)"
        ) from None


def _start_run(cfg: Any, run: str) -> None:
    """Record this serving run in the report (SQLite file or PostgreSQL) before workers start.
    A database that does not answer is said once here; each worker retries on its own."""
    from ctxbudget.memory.pg import DatabaseUnavailable
    from ctxbudget.proxy.config.database import open_database
    from ctxbudget.proxy.report import start_run

    db = open_database(cfg.database, os.environ)
    if db is None:
        start_run(cfg.report.path, run, time.time())
        return
    try:
        start_run(db, run, time.time())
    except DatabaseUnavailable as exc:
        print(f"ctxbudget: ⚠ {exc}; serving anyway (the report and memories answer 503 until "
              "it does)", file=sys.stderr)  # fmt: skip
    finally:
        db.close()


def _warn_if_open(cfg: Any) -> None:
    """Say it loudly when anyone on the network can use the proxy (and its upstream key)."""
    from ctxbudget.proxy.access.guard import is_loopback
    from ctxbudget.proxy.config.schema import proxy_keys

    if is_loopback(cfg.proxy.host) or proxy_keys(cfg, os.environ):
        return
    log.warning(
        "ctxbudget listens on %s, beyond this machine, and no proxy keys are set: anyone who "
        "can reach it can read the report, add memories and spend the upstream key. Set $%s "
        "(comma-separated keys) or listen on 127.0.0.1.",
        cfg.proxy.host,
        cfg.proxy.keys_env,
    )


def _check_port(host: str, port: int) -> None:
    """Refuse to start, before the banner, when the port is taken (uvicorn says it after)."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise SystemExit(
                    f"ctxbudget: port {port} on {host} is in use{running_there(host, port)}: "
                    "pass --port or set proxy.port"
                ) from None
            raise SystemExit(f"ctxbudget: cannot listen on {host}:{port}: {exc.strerror}") from None


def running_there(host: str, port: int) -> str:
    """`, by ctxbudget (already running: …)` when what holds `host`:`port` answers /healthz
    as ctxbudget does, else nothing: a second `serve` is then the likelier mistake."""
    import httpx

    from ctxbudget.proxy.routes.report import page_url

    base = page_url(host, port).removesuffix("/context/budget")
    try:
        answer = httpx.get(f"{base}/healthz", timeout=1.0).json()
    except (httpx.HTTPError, ValueError):
        return ""
    if not isinstance(answer, dict) or answer.get("service") != "ctxbudget":
        return ""
    return (
        f", by ctxbudget already running there (its report: `ctxbudget report`, or "
        f"{base}/context/budget; stop it first to restart it)"
    )


def _warn_if_keys_without_upstream_key(cfg: Any) -> None:
    """With proxy keys, the client's credential is a proxy key and is not forwarded: without
    an upstream key every request reaches the provider with no credentials."""
    from ctxbudget.proxy.config.schema import proxy_keys, upstream_api_key
    from ctxbudget.proxy.urls import redact

    if proxy_keys(cfg, os.environ) and not upstream_api_key(cfg, os.environ):
        log.warning(
            "proxy keys are set but no upstream key is: requests will reach %s without "
            "credentials. Put the provider key in $%s (proxy.upstream.apiKeyEnv).",
            redact(cfg.proxy.upstream.base_url),
            cfg.proxy.upstream.api_key_env or "OPENAI_API_KEY",
        )


SWITCH_INTERVAL = 0.001


def app_factory() -> Any:
    """Build the app inside a uvicorn worker from what `serve` put in the environment."""
    from ctxbudget.proxy.app import create_app
    from ctxbudget.proxy.config.schema import ConfigSource

    raw_path = os.environ.get(_ENV_CONFIG) or None
    overrides = json.loads(os.environ.get(_ENV_OVERRIDES) or "{}")
    source = ConfigSource(Path(raw_path) if raw_path else None, os.environ, overrides)
    # The report writer (and the span builder, with telemetry on) run on threads. With the
    # default 5 ms switch interval a busy thread can hold the GIL for 5 ms while a request
    # waits on the event loop; 1 ms bounds that wait (measured: docs/benchmarks.md).
    sys.setswitchinterval(SWITCH_INTERVAL)
    return create_app(source, run=os.environ.get(_ENV_RUN))


def _memory(args: argparse.Namespace) -> None:
    from ctxbudget.memory import InvalidMemory, NewMemory
    from ctxbudget.memory.store import search_rows
    from ctxbudget.proxy.config.settings import settings_for
    from ctxbudget.proxy.stores import open_store

    cfg = _source(args.config, {}).get()
    store = open_store(settings_for(cfg, os.environ), os.environ)
    try:
        if args.action == "add":
            try:
                added, evicted = store.add(
                    NewMemory(
                        owner=args.owner,
                        text=args.text,
                        category=args.category,
                        source=args.source,
                        scope=args.scope,
                    )
                )
            except InvalidMemory as exc:
                print(f"ctxbudget: memory not added: {exc}", file=sys.stderr)
                raise SystemExit(2) from None
            if args.json:
                print(
                    json.dumps(
                        {"memory": added.to_dict(), "evicted": [m.to_dict() for m in evicted]}
                    )
                )
            else:
                print(f"added memory {added.id} ({added.category}, {added.scope})")
                for gone in evicted:
                    print(f"evicted memory {gone.id} (least recently used): {gone.text}")
        elif args.action in ("list", "search"):
            rows: list[dict[str, Any]]
            if args.action == "list":
                rows = [m.to_dict() for m in store.all(args.owner, scope=args.scope)]
            else:
                # relevance 0-100, the best hit 100 (BM25's own number is in --json's `bm25`)
                rows = search_rows(store.search(args.owner, args.query))
            if args.json:
                print(json.dumps(rows, ensure_ascii=False))
            else:
                for m in rows:
                    extra = f" relevance={m['relevance']:g}" if "relevance" in m else ""
                    print(f"{m['id']}\t{m['category']}\t{m['scope']}\t{m['text']}{extra}")
                if not rows:
                    # On stderr: a pipe reading the rows gets none, a person sees why.
                    print(_nothing_found(args, _where(cfg)), file=sys.stderr)
        elif args.action == "import":
            _import(args, store)
        elif args.action == "export":
            from ctxbudget.memory.transfer import export_jsonl

            sys.stdout.write(export_jsonl(store.all(args.owner, scope=args.scope)))
        elif args.action == "rm":
            removed = store.remove(args.owner, args.id)
            if args.json:
                print(json.dumps({"id": args.id, "deleted": removed}))
            elif removed:
                print(f"removed memory {args.id}")
            if not removed:
                if not args.json:
                    print(
                        f"ctxbudget: no memory {args.id} for owner {args.owner!r}", file=sys.stderr
                    )
                raise SystemExit(1)
    finally:
        store.close()


def _import(args: argparse.Namespace, store: Any) -> None:
    from ctxbudget.memory import InvalidMemory
    from ctxbudget.memory.transfer import not_stored, parse_jsonl, parse_markdown

    name = args.file
    try:
        text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SystemExit(f"ctxbudget: cannot read {name}: {exc}") from None
    kind = args.format
    if kind == "auto":
        kind = "jsonl" if name == "-" or name.endswith((".jsonl", ".json")) else "md"
    started = time.perf_counter()
    try:
        parsed = (
            parse_jsonl(text, args.owner, store.limits)
            if kind == "jsonl"
            else parse_markdown(
                text, args.owner, category=args.category, categories=store.limits.categories
            )
        )
        new = not_stored(parsed, store.all(args.owner))  # an export imported back: no twins
        added, evicted = store.add_many(new)
    except InvalidMemory as exc:
        print(f"ctxbudget: nothing imported from {name}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    took = time.perf_counter() - started
    there = len(parsed) - len(new)
    if args.json:
        print(
            json.dumps(
                {
                    "imported": len(added),
                    "alreadyThere": there,
                    "evicted": [m.to_dict() for m in evicted],
                }
            )
        )
    else:
        print(
            f"imported {len(added)} memor{'y' if len(added) == 1 else 'ies'} from {name} "
            f"in {took * 1000:.0f} ms"
            + (f"; {there} already there (same text and scope), skipped" if there else "")
            + (f"; evicted {len(evicted)} least recently used" if evicted else "")
        )


def _where(cfg: Any) -> str:
    """Where the memories are: the SQLite file, or the database (password hidden)."""
    from ctxbudget.proxy.urls import redact

    return redact(cfg.database.url) if cfg.database.url else str(cfg.memory.store.path)


def _nothing_found(args: argparse.Namespace, store: Path | str) -> str:
    whose = f"owner {args.owner!r} in {store}"
    if args.action == "search":
        return f"no memories match {args.query!r} ({whose})"
    scope = f" in scope {args.scope!r}" if args.scope else ""
    return f"no memories{scope} ({whose})"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _recall(args: argparse.Namespace) -> None:
    from ctxbudget.memory.query import UserTurn
    from ctxbudget.memory.recaller import Recaller, RecallRequest
    from ctxbudget.proxy.config.settings import settings_for
    from ctxbudget.proxy.stores import open_store
    from ctxbudget.proxy.tokens import TokenCounter
    from ctxbudget.proxy.upstream.rewrite import Rewriter

    settings = settings_for(_source(args.config, {}).get(), os.environ)
    store = open_store(settings, os.environ)
    try:
        recaller = Recaller(store, settings.recall)
        turn = UserTurn(index=0, text=args.query, last=True)
        words: list[str] = []
        note: str | None = None
        profile = recaller.profile_for(args.owner, turn, args.budget)
        if settings.rewrite is not None and profile is not None and profile.name == "deep":
            words, note = asyncio.run(Rewriter().words(turn.query, settings.rewrite, os.environ))
        tokens = TokenCounter()
        encoding = settings.default_encoding
        recalled = recaller.recall(
            turn,
            RecallRequest(
                owner=args.owner,
                agent=args.agent,
                profile=args.budget,
                max_chars=settings.memory_max_chars(settings.enabled),
                count_tokens=lambda text: tokens.count(text, encoding),
                extra_words=words,
                rewrite_note=note,
                dry_run=True,
            ),
        )
        texts = {m.id: m.text for m in store.all(args.owner)}
    finally:
        store.close()
    info: dict[str, Any]
    if recalled is None:
        info = {
            "injected": 0,
            "candidates": 0,
            "memories": [],
            "dropped": [],
            "reason": "no memories for this owner",
        }
    else:
        info = recalled.report.to_dict()
    for entry in info["memories"] + info["dropped"]:
        entry["text"] = texts.get(entry["id"])
    if args.json:
        print(json.dumps(info, indent=2, ensure_ascii=False))
        return
    print(
        f"profile {info.get('applied', '-')} ({info['reason']}): "
        f"{_plural(info['candidates'], 'candidate')}, {info['injected']} injected, "
        f"bound by {info.get('boundBy', '-')}"
    )
    for m in info["memories"]:
        print(f"  {m['score']:7.2f}  {m['text']}")
        print(
            f"           relevance {m['relevance']:g}/100 (keywords {m['keyword']:g}, second hop "
            f"{m['hop']:g}, context {m['context']:g}), speaker {m.get('speaker', 0)}, "
            f"recency {m['recency']}, category "
            f"{m['category']}, source {m['source']}, access {m['access']}"
        )
    if info.get("secondHopWords"):
        print(f"  second hop searched: {', '.join(info['secondHopWords'])}")
    for d in info["dropped"]:
        print(f"  dropped  {d['text']} ({d['why']})")


def _analyze(args: argparse.Namespace) -> None:
    from ctxbudget.memory.monitor import MIN_REQUESTS, analysis
    from ctxbudget.proxy.config.settings import settings_for
    from ctxbudget.proxy.stores import open_store

    minimum = MIN_REQUESTS if args.min_requests is None else args.min_requests
    if minimum < 1:
        raise SystemExit("ctxbudget: --min-requests must be at least 1")
    source = _source(args.config, {})
    settings = settings_for(source.get(), os.environ)
    store = open_store(settings, os.environ)
    try:
        result = analysis(
            store.monitor,
            settings.recall.budget_profiles,
            days=args.days,
            owner=args.owner,
            agents=settings.recall.agents,
            default_profile=settings.recall.default_budget_profile,
            min_requests=minimum,
        )
    finally:
        store.close()
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
        return
    print(_analysis_text(result, args.days, source.path), end="")


def _analysis_text(result: dict[str, Any], days: float, path: Path | None) -> str:
    from ctxbudget.proxy.config.file import snippet
    from ctxbudget.proxy.report.render import change_text, profile_of

    needs = result["minRequests"]
    lines = [
        f"{_plural(result['requests'], 'request')} with memory recall in the last {days:g} days "
        f"(a recommendation needs {needs} of one agent)"
    ]
    found = result["recommendations"]
    for r in found:
        change, profile = change_text(r), profile_of(r)
        lines.append(
            f"- {r['agent']} ({profile}, {r['requests']} requests): {change} — {r['reason']}; "
            f"confidence {r['confidence']:.2f}"
        )
        lines.append("  " + _who_else(r, profile))
        if r["set"]:
            where = f"into {path}" if path else "into a config file (`ctxbudget config init`)"
            keys = ", ".join(r["set"])
            lines.append(f"  Paste {where}; {keys}: the whole map, so keep your other entries:")
            lines.extend("    " + line for line in snippet(r["set"]).splitlines())
    for few in result["tooFewRequests"]:
        lines.append(
            f"- {few['agent']} ({few['profile']}): {_plural(few['requests'], 'request')}, too few "
            f"to recommend a change (needs {needs}; --min-requests N lowers it)"
        )
    if not found:
        if result["tooFewRequests"] or not result["requests"]:
            lines.append("no recommendations yet: not enough data")
        else:
            lines.append("no recommendations: budgets fit the observed use")
    return "\n".join(lines) + "\n"


def _who_else(r: dict[str, Any], profile: str) -> str:
    """Whose budgets the recommended change touches besides the agent's, said plainly."""
    others = list(r["sharedWith"])
    if r["sharedWithUnlisted"]:
        others.append("every agent not in memory.budgets.agents")
    shared = (
        ", ".join(others[:-1]) + (" and " if len(others) > 1 else "") + others[-1] if others else ""
    )
    agent = r["agent"]
    if r["kind"] != "scope-weights":
        if not others:
            return f"Changes {agent} only."
        return f"Changes {agent} only: {profile} stays as it is for {shared}."
    own = r["set"].get("memory.budgets.agents", {}).get(agent)
    if own is None or own == profile:
        if not others:
            return f"Changes {agent} only (no other agent uses {profile})."
        return f"Changing {profile} also changes the budgets of {shared}."
    return (
        f"{profile} is shared with {shared}: this gives {agent} a profile of its own, {own}, so "
        f"theirs stay as they are (to change {profile} for all of them, set "
        f"memory.budgets.profiles.{profile}.scopeWeights instead)."
    )


def _config(args: argparse.Namespace) -> None:
    if args.action == "init":
        _config_init(args)
        return
    from ctxbudget.proxy.config.file import effective_values, nest, render_jsonc

    source = _source(args.config, _overrides(args))
    config = source.get()
    where = str(source.path) if source.path else "built-in defaults"
    if args.action == "check":
        print(f"ok: {where}")
        return
    values = effective_values(config)

    def shown(setting: Any) -> str:
        return FLAGS.get(setting.path, "--?") if setting.source == "cli" else setting.source

    if args.json:
        out = {
            "path": str(source.path) if source.path else None,
            "config": nest(values),
            "sources": {v.path: shown(v) for v in values},
        }
        print(json.dumps(out, indent=2, ensure_ascii=False))
        return
    file = str(source.path)

    def said(setting: Any) -> str:
        return "file" if setting.source == file else shown(setting)

    print(f"// The config in force. file: {where}")
    print("// After each value, where it came from: file, $VARIABLE, --flag or default.")
    print(render_jsonc(values, comment=said), end="")


def _config_init(args: argparse.Namespace) -> None:
    from ctxbudget.proxy.config.file import absolute, find_config, home_config, starter_text

    if args.path and args.config and args.path != args.config:
        raise SystemExit("ctxbudget: give the file once: PATH or --config, not both")
    given = args.path or args.config
    path = absolute(given, Path.cwd()) if given else home_config(Path.home())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w" if args.force else "x", encoding="utf-8") as out:
            out.write(starter_text())
    except FileExistsError:
        raise SystemExit(
            f"ctxbudget: {path} already exists; pass --force to overwrite it "
            "(`ctxbudget config check` validates it as it is)"
        ) from None
    except OSError as exc:
        raise SystemExit(f"ctxbudget: cannot write {path}: {exc.strerror or exc}") from None
    print(f"wrote {path}")
    try:
        found = find_config(None, os.environ, cwd=Path.cwd(), home=Path.home())
    except ConfigError:  # $CTXBUDGET_CONFIG names a missing file: every command will say so
        return
    if found.path is None:
        print(
            f"ctxbudget: commands find it only when told: --config {path} or "
            f"CTXBUDGET_CONFIG={path}",
            file=sys.stderr,
        )
    elif found.path != path:
        print(
            f"ctxbudget: commands run here still use {found.path}, which comes first (--config, "
            "$CTXBUDGET_CONFIG, ./ctxbudget.jsonc, ./ctxbudget.json, ~/.ctxbudget/config.jsonc)",
            file=sys.stderr,
        )


def _report(args: argparse.Namespace) -> None:
    """The report `serve` answers with the same config: the same file or database, the same
    recommendations, its page's address."""
    from ctxbudget.memory import SQLiteMemoryStore
    from ctxbudget.memory.pg import DatabaseUnavailable
    from ctxbudget.proxy.config.database import open_database
    from ctxbudget.proxy.config.settings import settings_for
    from ctxbudget.proxy.report import build_report, open_db, read_summary, render_text
    from ctxbudget.proxy.report.store import open_pg
    from ctxbudget.proxy.report.summary import parse_since
    from ctxbudget.proxy.routes.report import page_url, report_analysis
    from ctxbudget.proxy.stores import open_store

    try:
        since = parse_since(args.since) if args.since else None
    except ValueError as exc:
        raise SystemExit(f"ctxbudget: --since: {exc}") from None

    source = _source(args.config, {})
    cfg = source.get()
    settings = settings_for(cfg, os.environ)
    path: Path = settings.report_path
    pg = open_database(cfg.database, os.environ)
    if pg is not None:
        try:
            summary = read_summary(
                open_pg(pg).fetchall, recent=settings.recent_requests, since=since
            )
        except DatabaseUnavailable as exc:
            raise SystemExit(f"ctxbudget: {exc} (database.url)") from None
        finally:
            pg.close()
    elif not path.exists():
        summary = read_summary(lambda sql, args: [], recent=settings.recent_requests, since=since)
    else:
        db = open_db(path)
        try:
            summary = read_summary(db.fetchall, recent=settings.recent_requests, since=since)
        finally:
            db.close()
    report = build_report(summary, settings=settings.report_section(source))
    # what the server's report adds: the recommendations, and where its page is (a memory
    # store that does not exist yet has nothing to recommend from, and is not created here)
    memory = (
        SQLiteMemoryStore(Path(":memory:"))
        if pg is None and not settings.memory_path.exists()
        else open_store(settings, os.environ)
    )
    try:
        report["analysis"] = report_analysis(memory.monitor, settings, None)
    finally:
        memory.close()
    report["page"] = page_url(cfg.proxy.host, cfg.proxy.port)
    # said here, not in the server's report: a command run in another directory than `serve`
    # must show which files it read (the HTTP report does not name the server's files)
    report["data"] = {"report": str(path) if pg is None else _where(cfg), "memories": _where(cfg)}
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        print(render_text(report), end="")
