"""Who a request acts for: proxy keys, the admin key, and HTTP Basic for the report page.

- No `proxy.keys`: access is open and every request acts for the one owner, `default`.
- With proxy keys: `Authorization: Bearer <key>` (or `x-api-key: <key>`, as Anthropic clients
  send it) names the owner (constant-time compare);
  the report page also takes HTTP Basic with the key as the password, so a browser can ask.
- The admin key and the metrics key are Bearer tokens only (the report page: HTTP Basic too).
  `x-api-key` is how Anthropic clients send a *chat* key; no client sends an admin key there,
  and taking it would give a second header every admin route must be checked against.
- `/metrics` counts every owner's requests, so with proxy keys (or a metrics key) only the
  metrics key or the admin key may read it; a proxy key may not.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Mapping

from memory import DEFAULT_OWNER
from proxy.config.settings import Settings
from proxy.errors import Forbidden, Unauthorized


def owner_for(headers: Mapping[str, str], settings: Settings, *, browser: bool = False) -> str:
    """The owner the request acts for; `Unauthorized` when keys are set and none matches.

    With `browser` (the report page), HTTP Basic also works; the 401 asks the browser for it.
    """
    if not settings.proxy_keys:
        return DEFAULT_OWNER
    given = credential(headers, browser=browser)
    if given is not None:
        for key, owner in settings.proxy_keys.items():
            if same_secret(given, key):
                return owner
    error = Unauthorized(
        "missing or unknown proxy key: send 'Authorization: Bearer <key>' (or "
        f"'x-api-key: <key>') with one of the keys in ${settings.proxy_keys_env}"
        + (" (in a browser: any user name, the key as the password)" if browser else "")
    )
    if browser:
        error.headers = {"www-authenticate": 'Basic realm="ctxbudget report"'}
    raise error


def is_admin(headers: Mapping[str, str], settings: Settings, *, browser: bool = False) -> bool:
    """Whether the request carries the admin key (False when none is configured); with
    `browser`, also as the password of HTTP Basic."""
    if not settings.admin_key:
        return False
    given = credential(headers, browser=browser, api_key=False)
    return given is not None and same_secret(given, settings.admin_key)


def report_viewer(
    headers: Mapping[str, str], settings: Settings, *, browser: bool = False
) -> str | None:
    """Whose report the request may read: None for everyone's (no proxy keys, or the admin
    key), else its own key's owner only; `Unauthorized` without a valid key."""
    if not settings.proxy_keys or is_admin(headers, settings, browser=browser):
        return None
    return owner_for(headers, settings, browser=browser)


def check_metrics_reader(headers: Mapping[str, str], settings: Settings) -> None:
    """Let the request read `/metrics`, or raise. Open when access is (no proxy keys and no
    metrics key), like the report; else only the metrics key or the admin key: `Forbidden`
    for a proxy key (the figures add up every key's requests), `Unauthorized` otherwise."""
    if not settings.proxy_keys and not settings.metrics_key:
        return
    readers = [key for key in (settings.metrics_key, settings.admin_key) if key]
    reader = credential(headers, api_key=False)
    if reader is not None and any(same_secret(reader, key) for key in readers):
        return
    given = credential(headers)
    if given is not None:
        if any(same_secret(given, key) for key in settings.proxy_keys):
            raise Forbidden(
                "a proxy key may not read /metrics: it counts every key's requests. Scrape "
                f"with the key in ${settings.metrics_key_env} (proxy.metricsKeyEnv) or the "
                "admin key"
            )
    hint = (
        ""
        if readers
        else f"; neither is set, so nobody may: put a key in ${settings.metrics_key_env}"
    )
    raise Unauthorized(
        "/metrics needs 'Authorization: Bearer <key>' with the key in "
        f"${settings.metrics_key_env} (proxy.metricsKeyEnv) or the admin key "
        f"(${settings.admin_key_env}){hint}"
    )


def credential(
    headers: Mapping[str, str], *, browser: bool = False, api_key: bool = True
) -> bytes | None:
    """The secret the request presents, as bytes: a Bearer token or else (with `api_key`, for
    proxy keys) `x-api-key` (the header's own bytes: Starlette decodes headers as latin-1), or
    with `browser` an HTTP Basic password (UTF-8)."""
    header = headers.get("authorization")
    token = bearer(header)
    if token is None and api_key:
        token = headers.get("x-api-key") or None  # Anthropic clients send their key here
    if token is not None:
        return token.encode("latin-1", "replace")
    password = basic_password(header) if browser else None
    return password.encode("utf-8", "surrogateescape") if password is not None else None


def same_secret(given: bytes, key: str) -> bool:
    """Constant-time comparison of a presented credential with a configured key (UTF-8)."""
    return secrets.compare_digest(given, key.encode("utf-8", "surrogateescape"))


def bearer(value: str | None) -> str | None:
    """The token of `Bearer <token>`, else None."""
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def basic_password(value: str | None) -> str | None:
    """The password of `Basic <base64 user:password>`, else None."""
    scheme, _, encoded = (value or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None
    password = decoded.partition(":")[2]
    return password or None
