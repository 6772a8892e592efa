"""Upstream and database URLs: joining a path to a base URL, the credentials a base URL carries,
and the one redactor for every URL the proxy logs, reports or echoes.

A base URL may carry more than a place: `https://user:key@gateway/v1?api-version=X&key=Y`.
Its query is kept on every upstream URL, after the path (`join`); its user info is sent as
HTTP Basic by the upstream client when the request carries no `Authorization` header of its
own (`basic_auth`); and `redact` hides both wherever the URL is shown.
"""

from __future__ import annotations

import base64
from urllib.parse import unquote

from yarl import URL

HIDDEN = "***"


def redact(url: str) -> str:
    """`url` fit to show: its user info and each query value (and any fragment) replaced by
    `***`; a string that is not an absolute URL comes back as it was.

    >>> redact("https://user:sk-9@api.example/v1/x?key=s3cret&v=1")
    'https://***@api.example/v1/x?key=***&v=***'
    >>> redact("postgresql://app:pw@db:5432/ctxbudget?sslmode=require")
    'postgresql://***@db:5432/ctxbudget?sslmode=***'
    >>> redact("http://127.0.0.1:9/v1")
    'http://127.0.0.1:9/v1'
    >>> redact("gpt-4o")
    'gpt-4o'

    One the parser refuses (a bad port, PostgreSQL's `h1:5432,h2:5432` host lists) is cut the
    same way by hand: nothing after the scheme's `//` and before the last `@`, nothing after
    the first `?` or `#`.

    >>> redact("postgresql://app:pw@h1:5432,h2:5432/db?password=x")
    'postgresql://***@h1:5432,h2:5432/db?***'
    """
    if "://" not in url:
        return url
    try:  # yarl parses lazily: each property below may find the URL invalid
        return _redact_parsed(url, URL(url, encoded=True))
    except (ValueError, TypeError):
        return _redact_by_hand(url)


def _redact_parsed(url: str, parsed: URL) -> str:
    if not parsed.absolute or parsed.raw_host is None:
        return _redact_by_hand(url)
    userinfo = parsed.raw_user is not None or parsed.raw_password is not None
    out = f"{parsed.scheme}://{HIDDEN + '@' if userinfo else ''}"
    # yarl says `/` for a URL with no path: show the path only when there is one
    after = url.partition("://")[2]
    has_path = after[len(_authority(after)) :][:1] == "/"
    out += parsed.with_user(None).raw_authority + (parsed.raw_path if has_path else "")
    if parsed.raw_query_string or "?" in url.partition("#")[0]:
        out += "?" + "&".join(_hide_value(item) for item in parsed.raw_query_string.split("&"))
    if parsed.raw_fragment:
        out += "#" + HIDDEN
    return out


def _authority(rest: str) -> str:
    """The authority at the start of what follows a URL's `://`."""
    return rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]


def _hide_value(item: str) -> str:
    key, sep, _ = item.partition("=")
    # a bare item (`?sk-abc`) may be the secret itself
    return f"{key}={HIDDEN}" if sep else (HIDDEN if item else "")


def _redact_by_hand(url: str) -> str:
    scheme, _, rest = url.partition("://")
    cut = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    head, tail = rest[:cut], rest[cut:]
    # the user info ends at the last `@` before the path (a password may hold `@` or `/`)
    if "@" in head:
        head = HIDDEN + "@" + head.rpartition("@")[2]
    return f"{scheme}://{head}{'?' + HIDDEN if tail else ''}"


def split_base(base_url: str) -> tuple[str, str]:
    """A base URL as the part a path is appended to (no trailing `/`, no query, no fragment;
    user info kept) and its raw query string.

    >>> split_base("https://gw.example/v1/?api-version=2024-10&key=K#x")
    ('https://gw.example/v1', 'api-version=2024-10&key=K')
    >>> split_base("https://api.openai.com/v1")
    ('https://api.openai.com/v1', '')
    """
    parsed = URL(base_url, encoded=True)
    prefix = str(parsed.with_query(None).with_fragment(None)).rstrip("/")
    return prefix, parsed.raw_query_string


def join(prefix: str, path: str, *queries: str) -> str:
    """`prefix` + `path`, then the non-empty `queries` joined by `&` (the base URL's own query
    first, then the client's).

    >>> join("https://gw.example/v1", "/chat/completions", "key=K", "")
    'https://gw.example/v1/chat/completions?key=K'
    >>> join("https://api.anthropic.com/v1", "/messages", "", "beta=true")
    'https://api.anthropic.com/v1/messages?beta=true'
    """
    query = "&".join(q for q in queries if q)
    return f"{prefix}{path}?{query}" if query else prefix + path


def basic_auth(url: str) -> tuple[str, str | None]:
    """`url` without its user info, and that user info as an `Authorization: Basic` value
    (None when it has none). Percent-escapes in the user info are decoded first, as browsers
    and curl do.

    >>> basic_auth("https://me:p%40ss@gw.example/v1/x?k=1")
    ('https://gw.example/v1/x?k=1', 'Basic bWU6cEBzcw==')
    >>> basic_auth("https://gw.example/v1/x")
    ('https://gw.example/v1/x', None)
    """
    scheme, sep, rest = url.partition("://")
    authority = _authority(rest)
    if not sep or "@" not in authority:
        return url, None
    userinfo, _, host = authority.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = f"{unquote(user)}:{unquote(password)}".encode()
    return f"{scheme}://{host}{rest[len(authority) :]}", "Basic " + base64.b64encode(token).decode()
