"""What a web page in the user's browser could make the proxy do, refused at the door.

A keyless proxy on 127.0.0.1 trusts whoever can reach it, and a browser can reach it: any page
can POST `text/plain` to `http://127.0.0.1:4141/v1/memories` without a CORS preflight (a
planted memory is a persistent prompt injection), or spend the upstream key; and a DNS
rebinding page reaches it under its own host name. Agents and SDKs send none of the headers
browsers add, so the checks cost them nothing:

- **Host**: when the proxy listens on loopback, the `Host` header must be a loopback name
  (or one in `proxy.allowedHosts`); else 421. Beyond loopback, `proxy.allowedHosts` (when
  set) is the list.
- **Cross-site requests**: `Sec-Fetch-Site: cross-site|same-site`, or an `Origin` that is not
  the proxy's own (or in `proxy.allowedOrigins`), is refused (403) — except a browser's own
  top-level navigation to a page (GET, `Sec-Fetch-Mode: navigate`), which lets no page read
  anything.
- **Header size**: more than `MAX_HEADERS` headers or `MAX_HEADER_BYTES` of them is refused
  (431) before any route runs.
- **Content type**: a POST whose body is declared as one of the types a browser may send
  cross-origin without a preflight (`text/plain`, forms) is refused (415): send JSON.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from ctxbudget.proxy.config.schema import is_loopback
from ctxbudget.proxy.config.settings import Settings

__all__ = ["BrowserGuard", "is_loopback", "refuse"]

_READ = frozenset({"host", "origin", "sec-fetch-site", "sec-fetch-mode", "content-type"})
MAX_HEADERS = 100
MAX_HEADER_BYTES = 64 * 1024
SIMPLE_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data")


class BrowserGuard:
    """ASGI middleware applying the checks above to every HTTP request."""

    def __init__(self, app: ASGIApp, *, settings: Callable[[], Settings]) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw_headers = scope["headers"]
        size = sum(len(k) + len(v) for k, v in raw_headers)
        refusal: tuple[int, str, str] | None
        if len(raw_headers) > MAX_HEADERS or size > MAX_HEADER_BYTES:
            refusal = (
                431,
                "request_header_fields_too_large",
                f"{len(raw_headers)} headers of {size:,} bytes: the proxy takes at most "
                f"{MAX_HEADERS} headers and {MAX_HEADER_BYTES:,} bytes of them",
            )
        else:
            headers = {
                key: v.decode("latin-1")
                for k, v in raw_headers
                if (key := k.decode("latin-1").lower()) in _READ
            }
            settings = self.settings()
            # the request is served with these (one look at the config file a request)
            scope.setdefault("state", {})["settings"] = settings
            refusal = refuse(settings, scope["method"], headers)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, code, message = refusal
        error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
        if scope["path"].startswith(("/v1/messages", "/messages")):  # Anthropic's shape there
            error = {"type": "invalid_request_error", "message": message}
            body = orjson.dumps({"type": "error", "error": error})
        else:
            body = orjson.dumps({"error": error})
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def refuse(settings: Settings, method: str, headers: dict[str, str]) -> tuple[int, str, str] | None:
    """(status, code, message) when the request must be refused, else None."""
    loopback_only = settings.listen_loopback
    host = headers.get("host", "")
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.lower()
    if settings.allowed_hosts:
        ok = name in settings.allowed_hosts or (loopback_only and is_loopback(name))
    else:
        ok = not loopback_only or is_loopback(name)
    if not ok:
        return (
            421,
            "host_not_allowed",
            f"Host {host!r} is not this proxy's: it listens on loopback, so only "
            "localhost names are served (add the name to proxy.allowedHosts to allow it)",
        )
    navigation = method == "GET" and headers.get("sec-fetch-mode") == "navigate"
    site = headers.get("sec-fetch-site")
    origin = headers.get("origin")
    if not navigation:
        if site in ("cross-site", "same-site"):
            return (
                403,
                "cross_site_request",
                f"refused a {site} browser request: web pages may not use this proxy "
                "(add the page's origin to proxy.allowedOrigins to allow one)",
            )
        if origin and origin.rstrip("/").lower() not in _own_origins(host, settings):
            return (
                403,
                "cross_origin_request",
                f"refused a request from origin {origin!r}: web pages may not use this "
                "proxy (add the origin to proxy.allowedOrigins to allow it)",
            )
    content_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if method == "POST" and content_type in SIMPLE_TYPES:
        return (
            415,
            "unsupported_media_type",
            f"content-type {content_type} is not accepted: send the body as JSON with "
            "'content-type: application/json'",
        )
    return None


def _own_origins(host: str, settings: Settings) -> set[str]:
    own = {f"http://{host}".lower(), f"https://{host}".lower()}
    return own | settings.allowed_origins
