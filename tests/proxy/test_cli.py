"""What `ctxbudget serve` says before it starts."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from proxy.cli import _warn_if_keys_without_upstream_key
from proxy.config import Config


def test_serve_warns_when_proxy_keys_leave_the_upstream_without_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("CTXBUDGET_PROXY_KEYS", "k1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with caplog.at_level(logging.WARNING, logger="ctxbudget"):
        _warn_if_keys_without_upstream_key(Config())
    assert "proxy keys are set but no upstream key is" in caplog.text
    assert "$OPENAI_API_KEY" in caplog.text
    caplog.clear()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-up")
    _warn_if_keys_without_upstream_key(Config())
    assert caplog.records == []
