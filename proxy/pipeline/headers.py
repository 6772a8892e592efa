"""The `x-context-budget*` headers: what a request asks for, and what its answer says.

Request: `x-context-budget: on|off` (the caps), `-memories: on|off` (injection), `-profile`,
`-complexity`, `-agent`.
Response: request id, enabled, segments clamped, chars/tokens removed (or that would be,
with the budget off) and their value at the input price (`-gross-saved-usd`), memories
injected and the profile applied, `-memories-skipped: database-unavailable` when recall
could not run (`proxy/pipeline/recall.py`), `-pruning-skipped: database-unavailable` when a
request with prunable results got only the decisions the process holds, and no new prune
(`proxy/pipeline/prune.py`), and where the request's report entry is (`-report`).
`-saved-usd` is what the request saved net of cache effects — its cost without ctxbudget
minus its cost, from the reply's usage — on a JSON answer (read whole before its headers
go); a stream's headers leave before its usage, so a stream has none and its report entry
(`netSavedUsd`, at `-report`) has the figure once it ends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

from ctxbudget.memory.budget import TIERS, Complexity
from ctxbudget.memory.profiles import REQUESTED_PROFILES, RequestedProfile
from ctxbudget.proxy.errors import BadRequest
from ctxbudget.proxy.report.record import usd
from ctxbudget.proxy.report.tally import Tally

PREFIX = "x-context-budget"
_ON = ("on", "true", "1")
_OFF = ("off", "false", "0")
_T = TypeVar("_T", bound=str)


@dataclass(frozen=True, kw_only=True)
class RequestOptions:
    """What the client asked of the proxy for this request."""

    enabled: bool
    """Caps on (clamp) or off (only report what would be clamped)."""
    profile: RequestedProfile | None
    complexity: Complexity | None
    agent: str | None
    memories: bool = True
    """Memory injection for this request (`x-context-budget-memories: off` skips it); its own
    switch, apart from the caps: `x-context-budget: off` does not stop injection."""

    @classmethod
    def from_headers(cls, headers: Mapping[str, str], *, default_enabled: bool) -> RequestOptions:
        """Read the request headers; `BadRequest` naming the allowed values of a bad one."""
        return cls(
            enabled=_switch(headers, PREFIX, default_enabled),
            profile=choice(headers, "profile", REQUESTED_PROFILES),
            complexity=choice(headers, "complexity", TIERS),
            agent=headers.get(f"{PREFIX}-agent"),
            memories=_switch(headers, f"{PREFIX}-memories", True),
        )


def _switch(headers: Mapping[str, str], name: str, default: bool) -> bool:
    value = headers.get(name)
    if value is None:
        return default
    value = value.strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise BadRequest(f"header {name} must be 'on' or 'off', got {value!r}", param=name)


def choice(headers: Mapping[str, str], name: str, allowed: Sequence[_T]) -> _T | None:
    """Header `x-context-budget-<name>` restricted to `allowed`; 400 naming them otherwise."""
    header = f"{PREFIX}-{name}"
    value = headers.get(header)
    if value is None:
        return None
    value = value.strip().lower()
    if value not in allowed:
        options = ", ".join(allowed[:-1]) + f" or {allowed[-1]}"
        raise BadRequest(f"header {header} must be {options}, got {value!r}", param=header)
    return cast(_T, value)


def budget_headers(
    request_id: str,
    enabled: bool,
    tally: Tally,
    clamp_error: str | None,
    *,
    recorded: bool = True,
) -> dict[str, str]:
    """The headers every proxied answer carries (`-report` when the report keeps it), from
    the request's segments' sums (`proxy/report/tally.py`: carried, not summed again)."""
    clamped, saved_chars, _ = tally.acted("clamped")
    headers = {
        f"{PREFIX}-request-id": request_id,
        f"{PREFIX}-enabled": "true" if enabled else "false",
        f"{PREFIX}-clamped": str(clamped),
        f"{PREFIX}-saved-chars": str(saved_chars),
        f"{PREFIX}-memories": "0",
    }
    if recorded:
        headers[f"{PREFIX}-report"] = f"/context/budget/requests/{request_id}"
    if not enabled:
        would, would_chars, _ = tally.acted("would-clamp")
        headers[f"{PREFIX}-would-clamp"] = str(would)
        headers[f"{PREFIX}-would-save-chars"] = str(would_chars)
    if clamp_error:
        headers[f"{PREFIX}-clamp-error"] = "forwarded-untouched"
    return headers


def money_headers(
    headers: dict[str, str], enabled: bool, tally: Tally, price: float | None
) -> None:
    """Tokens removed (or that would be), and their value at the model's input price when it
    has one: gross, before cache effects (`-gross-saved-usd`, `-gross-would-save-usd`)."""
    saved = tally.acted("clamped" if enabled else "would-clamp")[2]
    name = "saved" if enabled else "would-save"
    headers[f"{PREFIX}-{name}-tokens"] = str(saved)
    money = usd(saved, price)
    if money is not None:
        headers[f"{PREFIX}-gross-{name}-usd"] = f"{money:.6f}"


def net_header(headers: dict[str, str], net_usd: float | None) -> None:
    """`x-context-budget-saved-usd`: what the request saved net of cache effects (negative
    when it cost more: a memory block, a cache bust), as the report's `netSavedUsd`."""
    if net_usd is not None:
        headers[f"{PREFIX}-saved-usd"] = f"{net_usd:.6f}"
