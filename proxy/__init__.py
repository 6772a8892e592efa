"""The ctxbudget HTTP proxy: Starlette app, upstream clients, config, report store, CLI."""

__all__: list[str] = []
