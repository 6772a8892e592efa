"""`proxy/urls.py`: one redactor for every URL shown, base URLs joined with their query kept,
user info as HTTP Basic (issue 24, item 10)."""

from __future__ import annotations

import base64
import doctest
import json
import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ctxbudget.proxy.urls
from ctxbudget.proxy.config.schema import ConfigSource
from ctxbudget.proxy.errors import ConfigError
from ctxbudget.proxy.urls import basic_auth, join, redact, split_base
from tests.inproc import config_for, proxy_app


def test_doctests() -> None:
    assert doctest.testmod(ctxbudget.proxy.urls).failed == 0


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://user:sk-9@api.example/v1/x?a=1", "https://***@api.example/v1/x?a=***"),
        ("https://sk-only@api.example/v1", "https://***@api.example/v1"),
        ("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1"),
        ("http://127.0.0.1:9", "http://127.0.0.1:9"),
        ("http://h/v1?token=X", "http://h/v1?token=***"),
        ("http://h/v1?sk-bare&api-version=2024", "http://h/v1?***&api-version=***"),
        ("http://h/v1#frag", "http://h/v1#***"),
        ("http://[::1]:8/x?y=1", "http://[::1]:8/x?y=***"),
        ("postgresql://app:s3cret@db:5432/ctxbudget", "postgresql://***@db:5432/ctxbudget"),
        ("postgresql://app@db/ctxbudget?password=pw", "postgresql://***@db/ctxbudget?password=***"),
        # the parser refuses these: cut by hand, the same way
        (
            "postgresql://a:pw@h1:5432,h2:5432/db?password=x",
            "postgresql://***@h1:5432,h2:5432/db?***",
        ),
        ("http://u:p@host:99999/a?b=1", "http://***@host:99999/a?***"),
        ("http://u:p/w@h/x?k=v", "http://***@h/x?***"),
        # not URLs: as they were (config show passes every string through)
        ("gpt-4o", "gpt-4o"),
        ("[Old tool result content cleared]", "[Old tool result content cleared]"),
    ],
)
def test_redact_hides_user_info_and_every_query_value(url: str, shown: str) -> None:
    assert redact(url) == shown


# "Z9" first: a secret that is never part of the host or path by chance
_SECRET = st.text(alphabet=string.ascii_letters + string.digits + "-_.~", min_size=6).map(
    lambda s: "Z9" + s
)


@given(
    user=_SECRET,
    password=_SECRET,
    value=_SECRET,
    host=st.sampled_from(["h", "127.0.0.1", "[::1]", "api.example", "h1:5432,h2", "h:99999"]),
    path=st.sampled_from(["", "/", "/v1", "/v1/"]),
)
def test_no_secret_of_a_url_survives_redaction(
    user: str, password: str, value: str, host: str, path: str
) -> None:
    for url in (
        f"https://{user}:{password}@{host}{path}?key={value}",
        f"https://{user}@{host}{path}?{value}",
        f"https://{host}{path}?a=1&token={value}#{password}",
    ):
        shown = redact(url)
        assert user not in shown and password not in shown and value not in shown, (url, shown)


def test_a_base_url_keeps_its_query_after_the_path() -> None:
    prefix, query = split_base("https://gw.example/openai/v1/?api-version=2024-10&key=K")
    assert join(prefix, "/chat/completions", query) == (
        "https://gw.example/openai/v1/chat/completions?api-version=2024-10&key=K"
    )
    # the client's own query comes after the base URL's
    assert join(prefix, "/responses", query, "stream=1") == (
        "https://gw.example/openai/v1/responses?api-version=2024-10&key=K&stream=1"
    )
    assert split_base("https://api.openai.com/v1") == ("https://api.openai.com/v1", "")
    # user info stays for the upstream client to turn into Basic
    assert split_base("http://u:p@h:9/v1?t=1") == ("http://u:p@h:9/v1", "t=1")


def test_user_info_becomes_basic_auth_decoded() -> None:
    url, header = basic_auth("https://me:p%40ss%3Aw@gw.example/v1/x?k=1")
    assert url == "https://gw.example/v1/x?k=1"
    assert header is not None
    assert base64.b64decode(header.removeprefix("Basic ")) == b"me:p@ss:w"
    assert basic_auth("https://gw.example/v1/x?k=a@b") == ("https://gw.example/v1/x?k=a@b", None)


def test_every_route_keeps_the_base_urls_query_after_its_path(tmp_path: Path) -> None:
    """`…/v1?token=X` + `/chat/completions` was `…/v1?token=X/chat/completions`: the path went
    into the token and the upstream answered 404 (issue 24, item 10)."""
    config = config_for(
        tmp_path,
        proxy={
            "upstream": {"baseUrl": "http://gw.test/v1/?api-version=2024&token=T1"},
            "anthropic": {"baseUrl": "http://u:p@ant.test?token=T2", "apiKeyEnv": None},
        },
    )
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    messages = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    with proxy_app(tmp_path, config) as (client, fake):
        for path, body in (
            ("/v1/chat/completions", chat),
            ("/v1/responses", {"model": "m", "input": "hi"}),
            ("/v1/messages?beta=true", messages),
            ("/v1/messages/count_tokens", messages),
        ):
            assert client.post(path, json=body).status_code == 200, path
        assert client.get("/v1/models").status_code == 200
    assert [s.url for s in fake.sent] == [
        "http://gw.test/v1/chat/completions?api-version=2024&token=T1",
        "http://gw.test/v1/responses?api-version=2024&token=T1",
        "http://u:p@ant.test/v1/messages?token=T2&beta=true",
        "http://u:p@ant.test/v1/messages/count_tokens?token=T2",
        "http://gw.test/v1/models?api-version=2024&token=T1",
    ]


def test_a_base_url_that_is_no_url_is_a_config_error_that_shows_no_secret(
    tmp_path: Path,
) -> None:
    for bad, problem in (
        ("http://u:sk-Z9x@gw.test:99999/v1?token=Z9t", "is not a valid URL"),
        ("u:sk-Z9x@gw.test/v1?token=Z9t", "must start with http:// or https://"),
    ):
        path = tmp_path / "ctxbudget.json"
        path.write_text(json.dumps({"proxy": {"upstream": {"baseUrl": bad}}}))
        with pytest.raises(ConfigError) as caught:
            ConfigSource(path, {}, {}).get()
        assert problem in str(caught.value)
        assert "Z9" not in str(caught.value), str(caught.value)
