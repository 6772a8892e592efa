"""/healthz beside a 30 MB request: how long other clients wait while the proxy clamps and
counts one huge body (the offload process, issue 10). The timing claims the test
(`tests/e2e/test_big_request.py`, which asserts only what holds on a loaded machine) leaves
to here: per run the request's time, the polls' median, 90th percentile and worst, and how
many polls waited over 50 ms; with the machine's 1-minute load average beside.

    .venv/bin/python bench/big_request.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.test_big_request import (  # noqa: E402
    poll_beside_a_30_mb_request,
    quantile,
    standin_process,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="runs per budget setting")
    args = parser.parse_args()
    print("budget  load  request   polls  median     p90    worst  polls over 50 ms")
    with standin_process() as upstream:
        for enabled in (True, False):
            for _ in range(args.runs):
                with tempfile.TemporaryDirectory() as tmp:
                    r, waits, took = poll_beside_a_30_mb_request(
                        Path(tmp), upstream, enabled=enabled
                    )
                assert r.status_code == 200, r.text[:300]
                late = [round(w * 1000) for w in waits if w > 0.05]
                print(
                    f"{'on ' if enabled else 'off'}    {os.getloadavg()[0]:4.1f}  "
                    f"{took:5.2f} s  {len(waits):5}  {quantile(waits, 0.5) * 1000:5.1f} ms "
                    f"{quantile(waits, 0.9) * 1000:5.1f} ms {max(waits) * 1000:6.1f} ms  "
                    f"{len(late)} {late if late else ''}"
                )


if __name__ == "__main__":
    main()
