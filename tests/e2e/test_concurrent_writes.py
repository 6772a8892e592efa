"""Every acknowledged memory write is kept, and every request is answered, under concurrency
(issue 10, item 1): HTTP adds at concurrency 16, two `ctxbudget memory add` processes and chat
requests (which recall and count accesses), all on one memory database at once.

On this machine this end-to-end run did not reproduce the lost writes the issue reports
(its client threads do not overlap transactions enough); the store-level test
`tests/memory/test_store.py::test_threads_sharing_one_store_lose_no_write` does, and fails on
the old store.
"""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.e2e.server import CTXBUDGET, base_config, serve
from tests.standin import StandIn

HTTP_ADDS = 240
CLI_ADDS = 15
CHATS = 60


def test_concurrent_adds_and_chats_lose_nothing(tmp_path: Path, standin: StandIn) -> None:
    config = base_config(tmp_path, standin.base_url)
    config["memory"]["maxMemories"] = 10_000
    with serve(tmp_path, config) as server:
        config_path = str(server.config_path)

        def cli_loop(name: str) -> list[int]:
            codes = []
            for i in range(CLI_ADDS):
                done = subprocess.run(
                    [
                        CTXBUDGET,
                        "memory",
                        "add",
                        f"cli {name} note {i} about deploys",
                        "--config",
                        config_path,
                        "--json",
                    ],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                codes.append(done.returncode)
            return codes

        def add(i: int) -> tuple[int, str]:
            r = httpx.post(
                f"{server.base_url}/memories",
                json={"text": f"http note {i} about deploys"},
                timeout=60,
            )
            return r.status_code, r.text

        def chat(i: int) -> int:
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": f"when do deploys happen? ({i})"}],
            }
            return httpx.post(
                f"{server.base_url}/chat/completions", json=body, timeout=60
            ).status_code

        with ThreadPoolExecutor(max_workers=2) as cli_pool, ThreadPoolExecutor(16) as pool:
            clis = [cli_pool.submit(cli_loop, name) for name in ("a", "b")]
            add_futures, chat_futures = [], []
            for i in range(HTTP_ADDS):  # a chat after every fourth add
                add_futures.append(pool.submit(add, i))
                if i % 4 == 0:
                    chat_futures.append(pool.submit(chat, i // 4))
            adds = [f.result() for f in add_futures]
            chats = [f.result() for f in chat_futures]
            cli_codes = [code for f in clis for code in f.result()]

        assert [s for s, _ in adds if s != 201] == [], [t for s, t in adds if s != 201][:3]
        assert set(chats) == {200}
        assert cli_codes == [0] * (2 * CLI_ADDS)
        listed = httpx.get(f"{server.base_url}/memories", timeout=30).json()["data"]
    texts = {m["text"] for m in listed}
    assert {f"http note {i} about deploys" for i in range(HTTP_ADDS)} <= texts
    for name in ("a", "b"):
        assert {f"cli {name} note {i} about deploys" for i in range(CLI_ADDS)} <= texts
    assert len(listed) == HTTP_ADDS + 2 * CLI_ADDS
