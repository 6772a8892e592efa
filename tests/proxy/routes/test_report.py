"""The report routes as a client meets them: odd query values are 400s, and the page cannot
be framed by another site."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.inproc import proxy_app


@pytest.mark.parametrize(
    "since", ["99999999999999999999d", "10000000000000w", "1" + "0" * 400 + "h", "5000000d"]
)
@pytest.mark.parametrize("fmt", ["json", "text", "summary", "html"])
def test_a_since_further_back_than_anything_is_the_whole_report(
    tmp_path: Path, since: str, fmt: str
) -> None:
    """`?since=` a duration longer than the calendar (issue 35): all of it, not a 500."""
    with proxy_app(tmp_path) as (client, _):
        everything = client.get(f"/context/budget?format={fmt}")
        r = client.get(f"/context/budget?format={fmt}&since={since}")
    assert r.status_code == 200, r.text
    if fmt == "json":
        assert r.json()["totals"] == everything.json()["totals"]


def test_the_report_page_may_not_be_framed(tmp_path: Path) -> None:
    """Another site's page cannot put the report in a frame (clickjacking, issue 35)."""
    with proxy_app(tmp_path) as (client, _):
        r = client.get("/context/budget", headers={"accept": "text/html"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
