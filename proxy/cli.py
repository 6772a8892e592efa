"""`ctxbudget` command line.

    ctxbudget serve  [--config PATH] [--host H] [--port P] [--workers N]
    ctxbudget report [--config PATH] [--json]

Every command takes `--config PATH` (else `$CTXBUDGET_CONFIG`, else `./ctxbudget.jsonc`, else
built-in defaults). `--json` prints machine-readable JSON on stdout and nothing else.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from proxy.errors import ConfigError

# Set by `serve` for its uvicorn workers, which rebuild the app from them.
_ENV_CONFIG = "CTXBUDGET_SERVE_CONFIG"
_ENV_OVERRIDES = "CTXBUDGET_SERVE_OVERRIDES"
_ENV_RUN = "CTXBUDGET_RUN_ID"

log = logging.getLogger("ctxbudget")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ctxbudget",
        description="An OpenAI-compatible proxy that clamps agent context to contextBudget caps.",
    )
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
    return parser


def _source(config: str | None, overrides: dict[str, Any]) -> Any:
    from proxy.config import ConfigSource, resolve_config_path

    path = resolve_config_path(config, os.environ, Path.cwd())
    return ConfigSource(path, os.environ, overrides)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `ctxbudget` console script."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            _serve(args)
        elif args.command == "report":
            _report(args)
    except ConfigError as exc:
        print(f"ctxbudget: config error:\n{exc.message}", file=sys.stderr)
        raise SystemExit(2) from None


def _serve(args: argparse.Namespace) -> None:
    import uvicorn

    from proxy.report import start_run

    overrides: dict[str, Any] = {}
    if args.host is not None:
        overrides["proxy.host"] = args.host
    if args.port is not None:
        overrides["proxy.port"] = args.port
    if args.workers < 1:
        raise SystemExit("ctxbudget: --workers must be at least 1")
    source = _source(args.config, overrides)  # fails here, before binding, on a broken config
    cfg = source.get()
    level = cfg.proxy.log_level
    logging.basicConfig(level=level.upper(), format="%(levelname)s %(name)s: %(message)s")
    run = secrets.token_hex(6)
    start_run(cfg.report.path, run, time.time())
    os.environ[_ENV_CONFIG] = str(source.path) if source.path else ""
    os.environ[_ENV_OVERRIDES] = json.dumps(overrides)
    os.environ[_ENV_RUN] = run
    budget = "ON" if cfg.agents.defaults.context_budget.enabled else "OFF (reporting would-clamp)"
    log.info(
        "ctxbudget %s on http://%s:%s/v1 → %s, contextBudget %s, config %s",
        "serving",
        cfg.proxy.host,
        cfg.proxy.port,
        cfg.proxy.upstream.base_url,
        budget,
        source.path or "built-in defaults",
    )
    uvicorn.run(
        "proxy.cli:app_factory",
        factory=True,
        host=cfg.proxy.host,
        port=cfg.proxy.port,
        workers=args.workers,
        log_level=level,
        access_log=level == "debug",
        timeout_graceful_shutdown=5,
    )


def app_factory() -> Any:
    """Build the app inside a uvicorn worker from what `serve` put in the environment."""
    from proxy.app import create_app
    from proxy.config import ConfigSource

    raw_path = os.environ.get(_ENV_CONFIG) or None
    overrides = json.loads(os.environ.get(_ENV_OVERRIDES) or "{}")
    source = ConfigSource(Path(raw_path) if raw_path else None, os.environ, overrides)
    return create_app(source, run=os.environ.get(_ENV_RUN))


def _report(args: argparse.Namespace) -> None:
    from proxy.render import build_report, render_text
    from proxy.report import open_db, read_summary
    from proxy.settings import settings_for

    source = _source(args.config, {})
    cfg = source.get()
    settings = settings_for(cfg, os.environ)
    path: Path = cfg.report.path
    if not path.exists():
        summary = read_summary(lambda sql, args=(): [], recent=settings.recent_requests)
    else:
        db = open_db(path)
        try:
            summary = read_summary(
                lambda sql, a=(): db.execute(sql, tuple(a)).fetchall(),
                recent=settings.recent_requests,
            )
        finally:
            db.close()
    report = build_report(summary, settings=settings.describe(source))
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        print(render_text(report), end="")
