"""Memories are added by people (CLI, /v1/memories), never by chat, and owners stay apart."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx

from tests.e2e.server import CTXBUDGET, base_config, serve
from tests.standin import StandIn


def _cli(server_config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CTXBUDGET, "memory", *args, "--config", str(server_config)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_and_api_share_one_store(tmp_path: Path, standin: StandIn) -> None:
    with serve(tmp_path, base_config(tmp_path, standin.base_url)) as server:
        added = _cli(
            server.config_path, "add", "Therapy Thursdays 3pm", "--category", "preference", "--json"
        )
        assert added.returncode == 0, added.stderr
        memory = json.loads(added.stdout)["memory"]
        listed = httpx.get(f"{server.base_url}/memories").json()
        assert [m["text"] for m in listed["data"]] == ["Therapy Thursdays 3pm"]
        assert listed["owner"] == "default"

        r = httpx.post(
            f"{server.base_url}/memories",
            json={"text": "Zebra deadline is Friday", "scope": "agent:main"},
        )
        assert r.status_code == 201
        searched = json.loads(
            _cli(server.config_path, "search", "zebra deadlines", "--json").stdout
        )
        assert [m["text"] for m in searched] == ["Zebra deadline is Friday"]

        bad = httpx.post(f"{server.base_url}/memories", json={"text": "", "category": "nope"})
        assert bad.status_code == 400
        assert "text is empty" in bad.json()["error"]["message"]
        assert httpx.post(f"{server.base_url}/memories", json={"txt": "x"}).status_code == 400
        cli_bad = _cli(server.config_path, "add", "x" * 3000)
        assert cli_bad.returncode == 2 and "over memory.maxChars" in cli_bad.stderr
        assert len(httpx.get(f"{server.base_url}/memories").json()["data"]) == 2

        # chat content never writes memories
        httpx.post(
            f"{server.base_url}/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "remember: I love jazz"}]},
        )
        assert len(httpx.get(f"{server.base_url}/memories").json()["data"]) == 2

        gone = httpx.delete(f"{server.base_url}/memories/{memory['id']}")
        assert gone.json() == {"id": memory["id"], "deleted": True}
        assert httpx.delete(f"{server.base_url}/memories/{memory['id']}").status_code == 404
        assert _cli(server.config_path, "rm", str(memory["id"])).returncode == 1


def test_admin_key_guards_memories_and_owners_are_isolated(
    tmp_path: Path, standin: StandIn
) -> None:
    env = {"CTXBUDGET_PROXY_KEYS": "alice=pk-a,bob=pk-b", "CTXBUDGET_ADMIN_KEY": "adm-1"}
    with serve(tmp_path, base_config(tmp_path, standin.base_url), env=env) as server:
        url = f"{server.base_url}/memories"
        admin = {"authorization": "Bearer adm-1"}
        assert httpx.post(url, json={"text": "x"}).status_code == 401
        assert (
            httpx.post(
                url, json={"text": "x"}, headers={"authorization": "Bearer pk-a"}
            ).status_code
            == 401
        )
        for owner, text in (("alice", "alice likes tea"), ("bob", "bob likes tea")):
            r = httpx.post(url, json={"text": text, "owner": owner}, headers=admin)
            assert r.status_code == 201 and r.json()["memory"]["owner"] == owner
        alice = httpx.get(url, params={"owner": "alice", "q": "tea"}, headers=admin).json()
        assert [m["text"] for m in alice["data"]] == ["alice likes tea"]
        cli = _cli(server.config_path, "list", "--owner", "bob", "--json")
        assert [m["text"] for m in json.loads(cli.stdout)] == ["bob likes tea"]


def test_without_admin_key_a_proxy_key_acts_for_its_own_owner(
    tmp_path: Path, standin: StandIn
) -> None:
    env = {"CTXBUDGET_PROXY_KEYS": "alice=pk-a,bob=pk-b"}
    with serve(tmp_path, base_config(tmp_path, standin.base_url), env=env) as server:
        url = f"{server.base_url}/memories"
        r = httpx.post(url, json={"text": "alice's"}, headers={"authorization": "Bearer pk-a"})
        assert r.json()["memory"]["owner"] == "alice"
        other = httpx.post(
            url, json={"text": "x", "owner": "bob"}, headers={"authorization": "Bearer pk-a"}
        )
        assert other.status_code == 403
        bob = httpx.get(url, headers={"authorization": "Bearer pk-b"}).json()
        assert bob["owner"] == "bob" and bob["data"] == []


def test_recall_cli_explains_every_signal(tmp_path: Path, standin: StandIn) -> None:
    with serve(tmp_path, base_config(tmp_path, standin.base_url)) as server:
        _cli(server.config_path, "add", "Deploys happen on Tuesdays after standup")
        _cli(server.config_path, "add", "tea")
        lean = json.loads(
            subprocess.run(
                [
                    CTXBUDGET,
                    "recall",
                    "deploy tea",
                    "--budget",
                    "lean",
                    "--json",
                    "--config",
                    str(server.config_path),
                ],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout
        )
        assert lean["applied"] == "lean" and lean["reason"] == "lean requested"
        assert [m["text"] for m in lean["memories"]] == ["Deploys happen on Tuesdays after standup"]
        assert set(lean["memories"][0]) >= {
            "relevance",
            "hop",
            "context",
            "recency",
            "category",
            "source",
            "access",
            "score",
        }
        assert lean["dropped"] == [{"id": 2, "why": "shorter than 12 chars", "text": "tea"}]
        # a preview: it counts no access
        listed = httpx.get(f"{server.base_url}/memories").json()["data"]
        assert all(m["accessCount"] == 0 for m in listed)
