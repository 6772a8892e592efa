"""The package as users install it (issue 36): the wheel puts nothing but `ctxbudget` at the top
level of site-packages; `pipx install .` and `uv tool install .` give a working `ctxbudget`; and
the container image's command (the Dockerfile's CMD with its ENV and deploy/container.jsonc)
serves from a plain install of that wheel. These machines have no container engine, so the
image itself is not built here: what it runs is.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import json5
import pytest

from tests.e2e.server import free_port
from tests.standin import StandIn

ROOT = Path(__file__).resolve().parents[2]
KEY = "pk-container-test"
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc")


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of what the Dockerfile copies: a build in place leaves build/ in the checkout."""
    source = tmp_path_factory.mktemp("source") / "ctxbudget"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for package in ("caps", "memory", "proxy"):
        shutil.copytree(ROOT / package, source / package, ignore=IGNORED)
    return source


@pytest.fixture(scope="module")
def wheel(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["--disable-pip-version-check", "--wheel-dir", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (found,) = out.glob("ctxbudget-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with the wheel installed as pip installs it (not editable); its dependencies
    are this venv's, read through a .pth (the venv's own .pth files, among them the checkout's
    editable finder, are not read from there). The venv's bin directory."""
    venv = tmp_path_factory.mktemp("venv") / "plain"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q"]
        + ["--disable-pip-version-check", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return venv / "bin"


def test_the_wheel_installs_nothing_but_ctxbudget_at_the_top_level(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert top == {"ctxbudget", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    # the three packages and their data files are all there, under the distribution's name
    for expected in (
        "ctxbudget/proxy/cli.py",
        "ctxbudget/proxy/wire/messages.py",
        "ctxbudget/caps/clamp.py",
        "ctxbudget/memory/store.py",
        "ctxbudget/proxy/config.example.jsonc",
        "ctxbudget/proxy/demo/sample-session.json",
        "ctxbudget/proxy/py.typed",
    ):
        assert expected in names, expected
    assert not [n for n in names if "__pycache__" in n or n.startswith("ctxbudget/tests")]


def test_the_plain_install_says_its_version_and_imports_from_itself(installed: Path) -> None:
    done = subprocess.run(
        [str(installed / "ctxbudget"), "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"ctxbudget \d+\.\d+\.\d+\S*\n", done.stdout), done.stdout
    where = subprocess.run(
        [str(installed / "python"), "-c", "import ctxbudget.proxy.cli as c; print(c.__file__)"],
        capture_output=True,
        text=True,
        cwd="/",
        check=True,
    ).stdout
    assert where.startswith(str(installed.parent)), where  # not the checkout's editable copy
    # and no top-level module of ours: another project's `memory` or `proxy` stays theirs
    bare = subprocess.run(
        [str(installed / "python"), "-c", "import proxy"], capture_output=True, cwd="/"
    )
    assert bare.returncode != 0


@pytest.mark.parametrize("tool", ["pipx", "uv"])
def test_a_tool_installer_gives_a_working_command(tool: str, source: Path, tmp_path: Path) -> None:
    """The README's `pipx install .` and `uv tool install .`: each into its own directories
    here (the package caches stay the user's: they make a second run take seconds)."""
    bin_dir = Path(sys.executable).parent
    home, bins = tmp_path / "home", tmp_path / "bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXBUDGET")}
    if tool == "pipx":
        argv = [str(bin_dir / "pipx"), "install", str(source)]
        env |= {"PIPX_HOME": str(home), "PIPX_BIN_DIR": str(bins)}
    else:
        argv = [str(bin_dir / "uv"), "tool", "install", str(source)]
        env |= {"UV_TOOL_DIR": str(home), "UV_TOOL_BIN_DIR": str(bins)}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    version = subprocess.run(
        [str(bins / "ctxbudget"), "--version"], capture_output=True, text=True, timeout=60
    )
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("ctxbudget ")
    # its environment has ctxbudget and its dependencies, and no top-level module of ours
    (site,) = home.glob("**/site-packages")
    assert (site / "ctxbudget" / "proxy" / "cli.py").exists()
    assert not {"proxy", "caps", "memory"} & {p.name for p in site.iterdir()}


def _image() -> tuple[list[str], dict[str, str]]:
    """The final stage's CMD (exec form) and ENV of the Dockerfile."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    final = text.split("\nFROM ")[-1]
    env: dict[str, str] = {}
    cmd: list[str] = []
    for line in final.splitlines():
        if line.startswith("ENV "):
            for pair in shlex.split(line[4:]):
                name, _, value = pair.partition("=")
                env[name] = value
        elif line.startswith("CMD "):
            cmd = json.loads(line[4:])
    return cmd, env


@pytest.fixture
def container(installed: Path, standin: StandIn, tmp_path: Path) -> Iterator[str]:
    """The image's CMD and ENV, run from the plain install; the image's config with its paths
    under `tmp_path`, loopback for 0.0.0.0 and the stand-in for the providers. Its root URL."""
    cmd, image_env = _image()
    assert cmd[0] == "ctxbudget", cmd
    config_path = Path(image_env["CTXBUDGET_CONFIG"])
    assert config_path == Path("/etc/ctxbudget/ctxbudget.jsonc")
    config = json5.loads((ROOT / "deploy" / "container.jsonc").read_text())
    assert config["proxy"]["host"] == "0.0.0.0"  # published ports reach it in a container
    port = free_port()
    config["proxy"] |= {"host": "127.0.0.1", "port": port}
    config["proxy"]["upstream"]["baseUrl"] = standin.base_url
    config["proxy"]["anthropic"]["baseUrl"] = standin.root
    state = tmp_path / "var-lib-ctxbudget"
    state.mkdir()
    for section in ("report", "memory"):
        holder = config[section]["store"] if section == "memory" else config[section]
        holder["path"] = holder["path"].replace("/var/lib/ctxbudget", str(state))
    local_config = tmp_path / "ctxbudget.jsonc"
    local_config.write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CTXBUDGET", "OPENAI"))}
    env |= image_env | {
        "CTXBUDGET_CONFIG": str(local_config),
        "HOME": str(state),
        "PATH": f"{installed}:{env.get('PATH', '')}",
        "CTXBUDGET_PROXY_KEYS": f"alice={KEY}",
        "OPENAI_API_KEY": "sk-upstream",
    }
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(installed / cmd[0]), *cmd[1:]], env=env, cwd=state, stdout=out, stderr=out
        )
    root = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            try:
                if httpx.get(f"{root}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield root
    finally:
        process.terminate()
        process.wait(timeout=20)
    assert f"config {local_config}" in log.read_text() or str(local_config) in log.read_text()


def test_the_images_command_serves_from_a_plain_install(container: str, standin: StandIn) -> None:
    refused = httpx.post(f"{container}/v1/chat/completions", json={}, timeout=10)
    assert refused.status_code == 401  # keys are required beyond loopback: the config sets them
    r = httpx.post(
        f"{container}/v1/chat/completions",
        headers={"authorization": f"Bearer {KEY}"},
        json={"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-context-budget-enabled"] == "true"  # the image's config: budget on
    assert standin.last_json["messages"] == [{"role": "user", "content": "hi"}]
    # the provider key comes from the environment, never the client's proxy key
    assert standin.received[-1].headers["authorization"] == "Bearer sk-upstream"
