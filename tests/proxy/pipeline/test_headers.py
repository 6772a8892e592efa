"""Request options from headers, and the budget headers of an answer."""

from __future__ import annotations

import base64
import re

import pytest

from ctxbudget.caps import Segment
from ctxbudget.proxy.access.auth import basic_password, bearer, owner_for
from ctxbudget.proxy.config.schema import Config
from ctxbudget.proxy.config.settings import Settings, settings_for
from ctxbudget.proxy.errors import BadRequest, Unauthorized
from ctxbudget.proxy.pipeline.headers import RequestOptions, budget_headers, money_headers
from ctxbudget.proxy.report.tally import Tally, tally


def _segment(action: str, before: int, after: int) -> Segment:
    return Segment(kind="web_fetch", label="u", before=before, after=after, action=action, cap=8)  # type: ignore[arg-type]


def test_options_default_and_validate() -> None:
    options = RequestOptions.from_headers({}, default_enabled=True)
    assert (options.enabled, options.profile, options.complexity, options.agent) == (
        True,
        None,
        None,
        None,
    )
    given = {
        "x-context-budget": " OFF ",
        "x-context-budget-profile": "Deep",
        "x-context-budget-complexity": "multi-system",
        "x-context-budget-agent": "ops",
    }
    options = RequestOptions.from_headers(given, default_enabled=True)
    assert (options.enabled, options.profile, options.complexity, options.agent) == (
        False,
        "deep",
        "multi-system",
        "ops",
    )
    with pytest.raises(
        BadRequest,
        match=re.escape(
            "header x-context-budget-profile must be lean, balanced, deep or auto, got 'huge'"
        ),
    ):
        RequestOptions.from_headers({"x-context-budget-profile": "huge"}, default_enabled=True)
    with pytest.raises(
        BadRequest,
        match=re.escape(
            "header x-context-budget-complexity must be simple, medium, complex or "
            "multi-system, got 'easy'"
        ),
    ):
        RequestOptions.from_headers({"x-context-budget-complexity": "easy"}, default_enabled=True)


def _tally(*segments: Segment, tokens: tuple[int, ...] = (), enabled: bool = True) -> Tally:
    counted = iter(tokens or (0,) * len(segments))  # asked for in order, as reported
    return tally(
        segments, key=(), enabled=enabled, price=None, saved_tokens=lambda s: next(counted)
    )


def test_budget_headers_count_clamped_or_would_clamp() -> None:
    on = budget_headers(
        "cb-1", True, _tally(_segment("clamped", 10, 4), _segment("kept", 3, 3)), None
    )
    assert on == {
        "x-context-budget-request-id": "cb-1",
        "x-context-budget-enabled": "true",
        "x-context-budget-clamped": "1",
        "x-context-budget-saved-chars": "6",
        "x-context-budget-memories": "0",
        "x-context-budget-report": "/context/budget/requests/cb-1",
    }
    # with the budget off, the clamp's `clamped` segments are what would be
    off = budget_headers(
        "cb-2", False, _tally(_segment("clamped", 10, 4), enabled=False), "RuntimeError: x"
    )
    assert off["x-context-budget-would-clamp"] == "1"
    assert off["x-context-budget-would-save-chars"] == "6"
    assert off["x-context-budget-clamp-error"] == "forwarded-untouched"


def test_money_headers_only_for_priced_models() -> None:
    priced: dict[str, str] = {}
    money_headers(priced, True, _tally(_segment("clamped", 10, 4), tokens=(1000,)), 2.5e-6)
    assert priced == {
        "x-context-budget-saved-tokens": "1000",
        "x-context-budget-gross-saved-usd": "0.002500",
    }
    unpriced: dict[str, str] = {}
    would = _tally(_segment("would-clamp", 10, 4), tokens=(7,))
    money_headers(unpriced, False, would, None)
    assert unpriced == {"x-context-budget-would-save-tokens": "7"}


def _keyed() -> Settings:
    return settings_for(Config(), {"CTXBUDGET_PROXY_KEYS": "alice=ka-1,loose-key"})


def test_owner_for_keys_bearer_and_browser_basic() -> None:
    settings = _keyed()
    assert owner_for({"authorization": "Bearer ka-1"}, settings) == "alice"
    assert owner_for({"authorization": "bearer loose-key"}, settings).startswith("key-")
    basic = "Basic " + base64.b64encode(b"anyone:ka-1").decode()
    assert owner_for({"authorization": basic}, settings, browser=True) == "alice"
    with pytest.raises(Unauthorized) as caught:
        owner_for({"authorization": basic}, settings)  # Basic only for the page
    assert caught.value.headers == {}
    with pytest.raises(Unauthorized) as caught:
        owner_for({}, settings, browser=True)
    assert caught.value.headers == {"www-authenticate": 'Basic realm="ctxbudget report"'}
    assert owner_for({}, settings_for(Config(), {})) == "default"


def test_credential_parsing() -> None:
    assert bearer("Bearer  tok ") == "tok"
    assert bearer("Basic tok") is None and bearer("Bearer ") is None and bearer(None) is None
    assert basic_password("Basic " + base64.b64encode(b"u:p:q").decode()) == "p:q"
    assert basic_password("Basic !!!") is None
    assert basic_password("Basic " + base64.b64encode(b"u:").decode()) is None


def test_a_bare_base64_key_stays_whole() -> None:
    settings = settings_for(Config(), {"CTXBUDGET_PROXY_KEYS": "c2VjcmV0LWtleQ==,bob=kb-2"})
    assert set(settings.proxy_keys) == {"c2VjcmV0LWtleQ==", "kb-2"}
    assert owner_for({"authorization": "Bearer c2VjcmV0LWtleQ=="}, settings).startswith("key-")
    with pytest.raises(Unauthorized):
        owner_for({"authorization": "Bearer ="}, settings)


def test_a_non_ascii_key_works_as_a_bearer_token_sent_as_utf8() -> None:
    from ctxbudget.proxy.access.auth import is_admin

    settings = settings_for(Config(), {"CTXBUDGET_ADMIN_KEY": "adm-ß-key"})
    as_sent = "Bearer adm-ß-key".encode().decode("latin-1")  # how Starlette reads the bytes
    assert is_admin({"authorization": as_sent}, settings)
    assert not is_admin({"authorization": "Bearer adm-ss-key"}, settings)
