"""The `ctxbudget` command line, run in-process through `main` in temporary directories."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ctxbudget.memory import SQLiteMemoryStore
from ctxbudget.memory.monitor import Usage
from ctxbudget.proxy.cli import _warn_if_keys_without_upstream_key, main
from ctxbudget.proxy.config.schema import Config, load_config

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Dirs:
    home: Path
    work: Path
    other: Path
    data: Path

    @property
    def home_config(self) -> Path:
        return self.home / ".ctxbudget" / "config.jsonc"


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Dirs:
    """A home and two working directories; the current one is `work`; no CTXBUDGET variables."""
    found = Dirs(*(tmp_path / name for name in ("home", "work", "other", "data")))
    for d in (found.home, found.work, found.other, found.data):
        d.mkdir()
    monkeypatch.setenv("HOME", str(found.home))
    monkeypatch.chdir(found.work)
    for name in list(os.environ):
        if name.startswith("CTXBUDGET"):
            monkeypatch.delenv(name)
    return found


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`ctxbudget ARGV`: exit code, stdout, stderr (a SystemExit message goes to stderr, as
    the interpreter would print it)."""
    code = 0
    message = ""
    try:
        main(list(argv))
    except SystemExit as exc:
        if isinstance(exc.code, str):
            code, message = 1, exc.code + "\n"
        else:
            code = exc.code or 0
    out, err = capsys.readouterr()
    return code, out, err + message


def write_config(path: Path, dirs: Dirs, extra: dict[str, Any] | None = None) -> Path:
    data: dict[str, Any] = {
        "memory": {"store": {"path": str(dirs.data / "memory.db")}},
        "report": {"path": str(dirs.data / "report.db")},
    }
    for key, value in (extra or {}).items():
        data.setdefault(key, {}).update(value)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def using(path: Path) -> str:
    return f"ctxbudget: using config {path}\n"


# -- which config ------------------------------------------------------------------------


def test_memory_list_from_another_directory_reads_the_config_in_home(
    dirs: Dirs, capsys: pytest.CaptureFixture[str]
) -> None:
    write_config(dirs.home_config, dirs)
    assert run(capsys, "memory", "add", "Deploys need a green build")[0] == 0
    os.chdir(dirs.other)
    code, out, err = run(capsys, "memory", "list")
    assert code == 0
    assert out.endswith("\tfact\tglobal\tDeploys need a green build\n")
    assert err == using(dirs.home_config)


def test_config_precedence_flag_env_jsonc_json_home(
    dirs: Dirs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = write_config(dirs.other / "flag.jsonc", dirs)
    named = write_config(dirs.other / "env.jsonc", dirs)
    jsonc = write_config(dirs.work / "ctxbudget.jsonc", dirs)
    plain = write_config(dirs.work / "ctxbudget.json", dirs)
    home = write_config(dirs.home_config, dirs)
    monkeypatch.setenv("CTXBUDGET_CONFIG", str(named))

    assert run(capsys, "config", "check", "--config", str(flag)) == (
        0,
        f"ok: {flag}\n",
        using(flag),
    )
    assert run(capsys, "config", "check") == (
        0,
        f"ok: {named}\n",
        f"ctxbudget: using config {named} (from $CTXBUDGET_CONFIG)\n",
    )
    monkeypatch.delenv("CTXBUDGET_CONFIG")
    assert run(capsys, "config", "check") == (
        0,
        f"ok: {jsonc}\n",
        f"ctxbudget: using config {jsonc} ({plain} is ignored: ctxbudget.jsonc comes first)\n",
    )
    jsonc.unlink()
    assert run(capsys, "config", "check") == (0, f"ok: {plain}\n", using(plain))
    plain.unlink()
    assert run(capsys, "config", "check") == (0, f"ok: {home}\n", using(home))
    # a relative --config is relative to the current directory
    assert run(capsys, "config", "check", "--config", "../other/flag.jsonc")[1] == f"ok: {flag}\n"


def test_without_a_config_file_the_defaults_say_where_they_looked(
    dirs: Dirs, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "memory", "list")
    assert (code, out) == (0, "")
    looked = [dirs.work / "ctxbudget.jsonc", dirs.work / "ctxbudget.json", dirs.home_config]
    assert err == (
        "ctxbudget: using built-in defaults (no config file found: looked in "
        + ", ".join(map(str, looked))
        + ")\n"
        + f"no memories (owner 'default' in {dirs.home / '.ctxbudget' / 'memory.db'})\n"
    )


def test_a_config_file_named_by_flag_or_environment_must_exist(
    dirs: Dirs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_config(dirs.home_config, dirs)  # not a fallback for a named file
    missing = dirs.work / "missing.jsonc"
    assert run(capsys, "memory", "list", "--config", "missing.jsonc") == (
        2,
        "",
        f"ctxbudget: config error:\nconfig file {missing} (from --config) not found\n",
    )
    monkeypatch.setenv("CTXBUDGET_CONFIG", str(dirs.other))
    assert run(capsys, "report") == (
        2,
        "",
        f"ctxbudget: config error:\nconfig file {dirs.other} (from $CTXBUDGET_CONFIG) is not "
        "a file\n",
    )


def test_with_json_stdout_is_json_only_and_the_config_line_goes_to_stderr(
    dirs: Dirs, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(dirs.work / "ctxbudget.jsonc", dirs)
    commands = [
        ["memory", "add", "Deploys need a green build", "--json"],
        ["memory", "list", "--json"],
        ["memory", "search", "deploys", "--json"],
        ["memory", "search", "nothing-like-it", "--json"],
        ["recall", "how do deploys work", "--json"],
        ["report", "--json"],
        ["analyze", "--json"],
        ["config", "show", "--json"],
    ]
    for argv in commands:
        code, out, err = run(capsys, *argv)
        assert code == 0, argv
        json.loads(out)
        assert err == using(config), argv


def test_serve_names_its_config_on_stderr_and_in_the_banner(
    dirs: Dirs,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import uvicorn

    from ctxbudget.proxy import cli

    config = write_config(dirs.home_config, dirs)
    started: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.append(kw))
    for name in (cli._ENV_CONFIG, cli._ENV_OVERRIDES, cli._ENV_RUN):
        monkeypatch.setenv(name, "")  # serve sets them for its workers; restored after
    with caplog.at_level(logging.INFO, logger="ctxbudget"):
        code, out, err = run(capsys, "serve", "--port", "0")
    assert (code, out, err) == (0, "", using(config))
    assert started and started[0]["port"] == 0
    assert f"contextBudget OFF (reporting would-clamp), config {config}" in caplog.text
    # the one number memory is bounded by, from the cache registry and this config
    from ctxbudget.proxy.cache.registry import MB, rss_bound
    from ctxbudget.proxy.config.settings import settings_for
    from ctxbudget.proxy.pipeline.worker import WORKER_RSS

    cfg = load_config(config, env={}, overrides={})
    bound = rss_bound(settings_for(cfg, {}), cfg.proxy.limits, worker_rss=WORKER_RSS)
    assert f"memory: {bound.total // MB:,} MB at most: this process" in caplog.text


# -- config init | show | check ----------------------------------------------------------


def test_config_init_writes_the_commented_starter_to_home_and_never_overwrites(
    dirs: Dirs, capsys: pytest.CaptureFixture[str]
) -> None:
    example = (ROOT / "config.example.jsonc").read_text()
    assert run(capsys, "config", "init") == (0, f"wrote {dirs.home_config}\n", "")
    assert dirs.home_config.read_text() == example
    assert load_config(dirs.home_config, env={}, overrides={}).model_dump() == (
        Config().model_dump()
    )
    # every command now finds it, from any directory
    os.chdir(dirs.other)
    assert run(capsys, "config", "check")[1:] == (
        f"ok: {dirs.home_config}\n",
        using(dirs.home_config),
    )

    dirs.home_config.write_text("{} // mine")
    assert run(capsys, "config", "init") == (
        1,
        "",
        f"ctxbudget: {dirs.home_config} already exists; pass --force to overwrite it "
        "(`ctxbudget config check` validates it as it is)\n",
    )
    assert dirs.home_config.read_text() == "{} // mine"
    assert run(capsys, "config", "init", "--force")[0] == 0
    assert dirs.home_config.read_text() == example


def test_config_init_to_a_path_says_when_commands_would_not_find_it(
    dirs: Dirs, capsys: pytest.CaptureFixture[str]
) -> None:
    local = dirs.work / "ctxbudget.jsonc"
    assert run(capsys, "config", "init", "ctxbudget.jsonc") == (0, f"wrote {local}\n", "")
    assert local.read_text() == (ROOT / "config.example.jsonc").read_text()

    code, out, err = run(capsys, "config", "init", "../other/elsewhere.jsonc")
    assert (code, out) == (0, f"wrote {dirs.other / 'elsewhere.jsonc'}\n")
    assert err.startswith(f"ctxbudget: commands run here still use {local}, which comes first")

    local.unlink()
    code, out, err = run(capsys, "config", "init", "--config", str(dirs.data / "x.jsonc"))
    assert err == (
        f"ctxbudget: commands find it only when told: --config {dirs.data / 'x.jsonc'} or "
        f"CTXBUDGET_CONFIG={dirs.data / 'x.jsonc'}\n"
    )


def test_config_show_says_where_each_value_came_from_and_prints_no_secret(
    dirs: Dirs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(
        dirs.work / "ctxbudget.jsonc",
        dirs,
        {
            "proxy": {
                "host": "0.0.0.0",
                "upstream": {"baseUrl": "https://user:sk-in-url@llm.example/v1"},
            },
            "memory": {"budgets": {"contextWindows": {"gpt-4.1-mini": 1000000}}},
        },
    )
    env_name = "CTXBUDGET__AGENTS__DEFAULTS__CONTEXT_BUDGET__ENABLED"
    monkeypatch.setenv(env_name, "true")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-secret")
    monkeypatch.setenv("CTXBUDGET_PROXY_KEYS", "alice=pk-secret")

    code, out, err = run(capsys, "config", "show", "--json", "--port", "5000")
    assert (code, err) == (0, using(config))
    shown = json.loads(out)
    assert shown["path"] == str(config)
    assert shown["sources"]["proxy.host"] == str(config)
    assert shown["sources"]["proxy.port"] == "--port"
    assert shown["sources"]["agents.defaults.contextBudget.enabled"] == "$" + env_name
    assert shown["sources"]["proxy.logLevel"] == "default"
    assert shown["sources"]["memory.budgets.contextWindows.gpt-4.1-mini"] == str(config)
    assert shown["config"]["proxy"]["port"] == 5000
    assert shown["config"]["agents"]["defaults"]["contextBudget"]["enabled"] is True
    assert shown["config"]["proxy"]["upstream"]["baseUrl"] == "https://***@llm.example/v1"
    assert shown["config"]["proxy"]["upstream"]["apiKeyEnv"] == "OPENAI_API_KEY"

    code, out, err = run(capsys, "config", "show", "--port", "5000")
    assert code == 0
    for secret in ("sk-live-secret", "pk-secret", "sk-in-url"):
        assert secret not in out + err
    assert out.startswith(f"// The config in force. file: {config}\n")
    assert '    "host": "0.0.0.0",  // file\n' in out
    assert '    "port": 5000,  // --port\n' in out
    assert f'        "enabled": true,  // ${env_name}\n' in out
    assert '    "logLevel": "info",  // default\n' in out
    # what it prints is a config file: loaded alone, it gives the same config
    (dirs.data / "shown.jsonc").write_text(out)
    alone = load_config(dirs.data / "shown.jsonc", env={}, overrides={})
    effective = load_config(config, env={env_name: "true"}, overrides={"proxy.port": 5000})
    assert alone.model_dump(exclude={"proxy": {"upstream"}}) == effective.model_dump(
        exclude={"proxy": {"upstream"}}
    )
    assert alone.memory.budgets.context_windows == {"gpt-4.1-mini": 1000000}


def test_config_check_says_ok_or_renders_the_config_error(
    dirs: Dirs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run(capsys, "config", "check")[:2] == (0, "ok: built-in defaults\n")
    config = write_config(dirs.work / "ctxbudget.jsonc", dirs, {"proxy": {"prot": 1}})
    assert run(capsys, "config", "check") == (
        2,
        "",
        using(config)
        + f"ctxbudget: config error:\ninvalid config in {config}:\n"
        + "- proxy.prot: unknown key — did you mean port?\n",
    )
    write_config(config, dirs)
    monkeypatch.setenv("CTXBUDGET__PROXY__PORT", "-1")
    code, out, err = run(capsys, "config", "check")
    assert (code, out) == (2, "")
    assert err.endswith("- proxy.port must be >= 0, got -1 (from $CTXBUDGET__PROXY__PORT)\n")


# -- small things said plainly ------------------------------------------------------------


def test_version(dirs: Dirs, capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    assert run(capsys, "--version") == (0, f"ctxbudget {version('ctxbudget')}\n", "")


def test_an_empty_search_or_list_says_so_on_stderr(
    dirs: Dirs, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(dirs.work / "ctxbudget.jsonc", dirs)
    store = dirs.data / "memory.db"
    assert run(capsys, "memory", "search", "zebra") == (
        0,
        "",
        using(config) + f"no memories match 'zebra' (owner 'default' in {store})\n",
    )
    assert run(capsys, "memory", "list", "--scope", "agent:ops") == (
        0,
        "",
        using(config) + f"no memories in scope 'agent:ops' (owner 'default' in {store})\n",
    )
    run(capsys, "memory", "add", "Deploys need a green build")
    code, out, err = run(capsys, "memory", "search", "deploys")
    assert out.startswith("1\tfact\tglobal\tDeploys need a green build")
    assert err == using(config)


def test_recall_counts_one_candidate_in_the_singular(
    dirs: Dirs, capsys: pytest.CaptureFixture[str]
) -> None:
    write_config(dirs.work / "ctxbudget.jsonc", dirs)
    run(capsys, "memory", "add", "Deploys need a green build")
    out = run(capsys, "recall", "deploys")[1]
    assert ": 1 candidate, 1 injected, bound by candidates\n" in out


def test_recall_shows_each_signal_of_a_memory_said_by_the_person_asked_about(
    dirs: Dirs, capsys: pytest.CaptureFixture[str]
) -> None:
    write_config(dirs.work / "ctxbudget.jsonc", dirs)
    run(capsys, "memory", "add", "[8 May, 2023] Melanie: I run to de-stress")
    out = run(capsys, "recall", "how does Melanie de-stress?", "--budget", "deep")[1]
    assert "Melanie: I run to de-stress" in out
    assert ", speaker 25.0, " in out


# -- analyze -----------------------------------------------------------------------------


def _seed(store: Path, agent: str, n: int, *, loaded: int, scopes: dict[str, int]) -> None:
    db = SQLiteMemoryStore(store)
    try:
        for _ in range(n):
            db.monitor.record(
                Usage(
                    ts=time.time(),
                    owner="default",
                    agent=agent,
                    budget_profile="specialist-narrow",
                    retrieval_profile="balanced",
                    complexity="medium",
                    budget=1000,
                    tokens_loaded=loaded,
                    tokens_injected=min(loaded, 1000),
                    per_scope=scopes,
                )
            )
    finally:
        db.close()


def test_analyze_with_too_few_requests_says_so_instead_of_recommending(
    dirs: Dirs, capsys: pytest.CaptureFixture[str]
) -> None:
    write_config(dirs.work / "ctxbudget.jsonc", dirs)
    _seed(dirs.data / "memory.db", "main", 3, loaded=1500, scopes={"global": 1500})
    code, out, _ = run(capsys, "analyze")
    assert (code, out) == (
        0,
        "3 requests with memory recall in the last 7 days (a recommendation needs 20 of one "
        "agent)\n"
        "- main (specialist-narrow): 3 requests, too few to recommend a change (needs 20; "
        "--min-requests N lowers it)\n"
        "no recommendations yet: not enough data\n",
    )
    result = json.loads(run(capsys, "analyze", "--json")[1])
    assert result["recommendations"] == []
    assert result["tooFewRequests"] == [
        {"agent": "main", "profile": "specialist-narrow", "requests": 3}
    ]
    assert [
        r["kind"]
        for r in json.loads(run(capsys, "analyze", "--json", "--min-requests", "3")[1])[
            "recommendations"
        ]
    ] == ["upgrade", "scope-weights"]


def test_analyze_prints_the_config_to_paste_and_names_who_shares_the_profile(
    dirs: Dirs, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(
        dirs.work / "ctxbudget.jsonc",
        dirs,
        {"memory": {"budgets": {"agents": {"writer": "role-coordinator"}}}},
    )
    store = dirs.data / "memory.db"
    _seed(store, "main", 25, loaded=1500, scopes={"global": 1500})
    _seed(store, "coder", 2, loaded=100, scopes={"agent_recent": 100})

    code, out, _ = run(capsys, "analyze")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == (
        "27 requests with memory recall in the last 7 days (a recommendation needs 20 of one agent)"
    )
    assert lines[1] == (
        "- main (specialist-narrow, 25 requests): upgrade to specialist-broad — exceeded its "
        "budget on 100% of 25 requests (> 20%); confidence 0.71"
    )
    assert lines[2] == (
        "  Changes main only: specialist-narrow stays as it is for coder and every agent not in "
        "memory.budgets.agents."
    )
    assert lines[3] == (
        f"  Paste into {config}; memory.budgets.agents: the whole map, so keep your other entries:"
    )
    assert lines[4] == (
        '    {"memory": {"budgets": {"agents": {"writer": "role-coordinator", "main": '
        '"specialist-broad"}}}}'
    )
    weights = lines.index(
        "- main (specialist-narrow, 25 requests): scope weights global 0.2 → 1, agent_recent "
        "0.5 → 0, agent_patterns 0.3 → 0 — actual scope use over 25 requests drifts 80% from "
        "the weights; confidence 0.71"
    )
    assert lines[weights + 1] == (
        "  specialist-narrow is shared with coder and every agent not in "
        "memory.budgets.agents: this gives main a profile of its own, main-tuned, so theirs "
        "stay as they are (to change specialist-narrow for all of them, set "
        "memory.budgets.profiles.specialist-narrow.scopeWeights instead)."
    )
    assert "- coder (specialist-narrow): 2 requests, too few" in out

    # Pasting what it says does what it says, and nothing else.
    found = json.loads(run(capsys, "analyze", "--json")[1])["recommendations"]
    assert [r["sharedWith"] for r in found] == [["coder"], ["coder"]]
    for r in found:
        data = json.loads(config.read_text())
        for dotted, value in r["set"].items():
            node = data
            *parents, last = dotted.split(".")
            for key in parents:
                node = node.setdefault(key, {})
            node[last] = value
        pasted = dirs.data / f"{r['kind']}.jsonc"
        pasted.write_text(json.dumps(data))
        budgets = load_config(pasted, env={}, overrides={}).memory.budgets
        before = load_config(config, env={}, overrides={}).memory.budgets
        assert budgets.agents["writer"] == "role-coordinator"
        assert budgets.default_profile == "specialist-narrow"
        assert {k: v for k, v in budgets.profiles.items() if k in before.profiles} == dict(
            before.profiles
        )
        if r["kind"] == "upgrade":
            assert budgets.agents["main"] == "specialist-broad"
        else:
            assert budgets.agents["main"] == "main-tuned"
            tuned = budgets.profiles["main-tuned"]
            assert tuned.scope_weights == {
                "global": 1.0,
                "agent_recent": 0.0,
                "agent_patterns": 0.0,
            }
            assert (tuned.tokens, tuned.max_tokens) == (20000, 50000)


def test_analyze_rejects_a_minimum_below_one(
    dirs: Dirs, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "analyze", "--min-requests", "0")[0::2] == (
        1,
        "ctxbudget: --min-requests must be at least 1\n",
    )


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


def test_relative_database_paths_are_next_to_the_config_that_names_them(
    dirs: Dirs, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 36, item 9: a config naming `report.db` and `memory.db` keeps them beside itself,
    whichever directory a command runs in; `report` says which config and which files."""
    config = dirs.data / "ctxbudget.jsonc"
    config.write_text(
        json.dumps({"memory": {"store": {"path": "memory.db"}}, "report": {"path": "report.db"}})
    )
    os.chdir(dirs.other)
    code, _, _ = run(capsys, "memory", "add", "beside the config", "--config", str(config))
    assert code == 0
    assert (dirs.data / "memory.db").exists() and not (dirs.other / "memory.db").exists()
    os.chdir(dirs.work)
    code, out, err = run(capsys, "memory", "list", "--config", str(config))
    assert code == 0 and "beside the config" in out, err
    code, out, err = run(capsys, "report", "--config", str(config))
    assert code == 0 and err == using(config)
    assert f"Data: report {dirs.data / 'report.db'}, memories {dirs.data / 'memory.db'}" in out
    code, out, _ = run(capsys, "report", "--json", "--config", str(config))
    assert json.loads(out)["data"] == {
        "report": str(dirs.data / "report.db"),
        "memories": str(dirs.data / "memory.db"),
    }


def test_report_run_elsewhere_says_it_uses_the_defaults_and_where_its_data_is(
    dirs: Dirs, capsys: pytest.CaptureFixture[str]
) -> None:
    """`scripts/serve` in a checkout writes ./ctxbudget.jsonc naming ~/.ctxbudget/*.db; run from
    another directory, `report` finds no config and says so, and where the data it read is."""
    os.chdir(dirs.other)
    code, out, err = run(capsys, "report")
    assert code == 0
    assert err.startswith("ctxbudget: using built-in defaults (no config file found: looked in ")
    home = dirs.home / ".ctxbudget"
    assert f"Data: report {home / 'report.db'}, memories {home / 'memory.db'}" in out
    assert not home.exists()  # reading an empty report creates nothing


def test_memory_search_shows_relevance_from_0_to_100_the_best_hit_100(
    dirs: Dirs, capsys: pytest.CaptureFixture[str]
) -> None:
    write_config(dirs.work / "ctxbudget.jsonc", dirs)
    run(capsys, "memory", "add", "The orion deploy needs a green build")
    run(capsys, "memory", "add", "Deploy notes live in the wiki, deploy from main")
    for other in ("Coffee order: oat milk flat white", "Standup at ten", "Tabs in Makefiles"):
        run(capsys, "memory", "add", other)
    code, out, _ = run(capsys, "memory", "search", "orion deploy")
    rows = [line.rsplit(" relevance=", 1) for line in out.splitlines()]
    assert code == 0 and [row[0].split("\t")[0] for row in rows] == ["1", "2"]
    shown = [float(row[1]) for row in rows]
    assert shown[0] == 100 and 0 < shown[1] < 100  # not BM25's raw 2.21e-06
    code, out, _ = run(capsys, "memory", "search", "orion deploy", "--json")
    found = json.loads(out)
    assert [m["relevance"] for m in found] == shown and found[1]["bm25"] > 0
