"""`database.url`: PostgreSQL for memories, the monitor and the report, shared by any number of
proxies; unset, the SQLite files (`memory.store.path`, `report.path`) as before.

The password comes from the environment variable `database.passwordEnv` names (or is part of
`$CTXBUDGET_DATABASE_URL`); it never appears in the report, the log or `config show`
(`proxy.urls.redact`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ctxbudget.memory.pg import PgDatabase
from ctxbudget.proxy.config.schema import DatabaseConfig
from ctxbudget.proxy.urls import redact

log = logging.getLogger("ctxbudget.database")

redacted = redact
"""The one URL redactor, `proxy.urls.redact`, under the name `proxy.pipeline.recall` imports."""


def open_database(cfg: DatabaseConfig, env: Mapping[str, str]) -> PgDatabase | None:
    """A pool on `database.url`, or None when it is unset (the SQLite files). The pool
    connects in the background: a database that is down does not stop the proxy starting."""
    if cfg.url is None:
        return None
    password = None
    if cfg.password_env:
        password = env.get(cfg.password_env)
        if not password:
            log.warning(
                "database.passwordEnv names $%s, which is not set: connecting without a password",
                cfg.password_env,
            )
    log.info("database: %s (pool of %d)", redact(cfg.url), cfg.pool_size)
    return PgDatabase(
        cfg.url,
        password=password,
        pool_size=cfg.pool_size,
        connect_timeout=cfg.connect_timeout_seconds,
    )
