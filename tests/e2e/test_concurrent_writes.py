"""Every acknowledged memory write is kept, and every request is answered, under concurrency
(issue 10, item 1): HTTP adds at concurrency 16, two `ctxbudget memory add` processes and chat
requests (which recall and count accesses), all on one memory database at once.

On this machine this end-to-end run did not reproduce the lost writes the issue reports
(its client threads do not overlap transactions enough); the store-level test
`tests/memory/test_store.py::test_threads_sharing_one_store_lose_no_write` does, and fails on
the old store.
"""

from __future__ import annotations

import json
import subprocess
import threading
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


IMPORTS = 3
IMPORTED = 5_000


def test_chats_are_answered_while_memory_import_runs(tmp_path: Path, standin: StandIn) -> None:
    """`ctxbudget memory import` writes a whole file in one transaction; chat requests (which
    recall from the same database) keep being answered meanwhile, and every line lands."""
    config = base_config(tmp_path, standin.base_url)
    config["memory"]["maxMemories"] = IMPORTS * IMPORTED + 100
    files = []
    for n in range(IMPORTS):
        path = tmp_path / f"import-{n}.jsonl"
        path.write_text(
            "".join(
                json.dumps({"text": f"imported {n}-{i}: deploys happen on day {i % 7}"}) + "\n"
                for i in range(IMPORTED)
            )
        )
        files.append(path)
    with serve(tmp_path, config) as server:
        importing = threading.Event()
        importing.set()

        def imports() -> list[int]:
            codes = []
            try:
                for path in files:
                    done = subprocess.run(
                        [
                            CTXBUDGET,
                            "memory",
                            "import",
                            str(path),
                            "--config",
                            str(server.config_path),
                        ],
                        capture_output=True,
                        text=True,
                        timeout=120,
                    )
                    assert done.returncode == 0, done.stderr
                    codes.append(done.returncode)
            finally:
                importing.clear()
            return codes

        def chats() -> list[int]:
            statuses, i = [], 0
            while importing.is_set() or i < 5:
                body = {
                    "model": "m",
                    "messages": [{"role": "user", "content": f"when do deploys happen? ({i})"}],
                }
                statuses.append(
                    httpx.post(
                        f"{server.base_url}/chat/completions", json=body, timeout=60
                    ).status_code
                )
                i += 1
            return statuses

        with ThreadPoolExecutor(max_workers=4) as pool:
            chatting = [pool.submit(chats) for _ in range(3)]
            importer = pool.submit(imports)
            codes = importer.result()
            answered = [s for f in chatting for s in f.result()]
        listed = httpx.get(f"{server.base_url}/memories", timeout=60).json()["data"]
    assert codes == [0] * IMPORTS
    assert answered and set(answered) == {200}, answered[:10]
    texts = {m["text"] for m in listed}
    assert len(texts) == IMPORTS * IMPORTED
    assert (
        f"imported {IMPORTS - 1}-{IMPORTED - 1}: deploys happen on day {(IMPORTED - 1) % 7}"
        in texts
    )
