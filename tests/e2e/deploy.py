"""The files in `deploy/`, read for the tests: the unit's entries, the environment file."""

from __future__ import annotations

from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NAME = "ctxbudget.example.com"
INSTALL = "apt-get install -y --no-install-recommends nginx openssl"


def unit_entries(path: Path = DEPLOY / "ctxbudget.service") -> dict[str, list[str]]:
    """`Section.Key` → its values, in order (a key may repeat), of a systemd unit file."""
    entries: dict[str, list[str]] = {}
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, _, value = line.partition("=")
        entries.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return entries


def env_file(path: Path = DEPLOY / "ctxbudget.env") -> dict[str, str]:
    """The variables of an EnvironmentFile (KEY=VALUE lines; # comments), each key's
    `replace-me` filled in as a deployer must (`serve` refuses the placeholder)."""
    out: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip().replace("replace-me", "filled-by-the-test")
    return out
