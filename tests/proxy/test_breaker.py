"""`proxy/breaker.py`: after a failure, skip at once until a background check passes."""

from __future__ import annotations

import threading
import time

from ctxbudget.proxy.breaker import Breaker


def test_down_from_a_trip_until_a_check_passes() -> None:
    answers = [False, False, True]
    checks: list[float] = []
    recovered = threading.Event()
    seconds: list[float] = []

    def check() -> None:
        checks.append(time.monotonic())
        if not answers.pop(0):
            raise ConnectionError("still down")

    def back(down_for: float) -> None:
        seconds.append(down_for)
        recovered.set()

    breaker = Breaker(check, every=0.01, recovered=back)
    assert not breaker.down and checks == [], "nothing is checked before a failure"
    assert breaker.trip() is True
    assert breaker.down
    assert breaker.trip() is False, "already down: one outage, one notice"
    assert recovered.wait(5)
    assert not breaker.down and len(checks) == 3 and seconds[0] > 0
    time.sleep(0.05)
    assert len(checks) == 3, "no checks while it answers"
    assert breaker.trip() is True, "a later failure opens it again"
    breaker.close()


def test_a_closed_breaker_stops_checking() -> None:
    calls: list[int] = []

    def check() -> None:
        calls.append(1)
        raise ConnectionError("down")

    breaker = Breaker(check, every=0.01)
    breaker.trip()
    time.sleep(0.05)
    breaker.close()
    time.sleep(0.05)
    seen = len(calls)
    time.sleep(0.05)
    assert len(calls) == seen and breaker.down
