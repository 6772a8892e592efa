"""The dependency rules of DESIGN.md, checked on the source: caps imports nothing of ours,
memory nothing from proxy, and no package has an import cycle."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("caps", "memory", "proxy")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


@functools.cache
def _parsed(path: Path) -> ast.Module:
    """`path`'s syntax tree, parsed once for the checks below (each reads every module)."""
    return ast.parse(path.read_text())


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Our modules `path` imports at import time (not under TYPE_CHECKING or in a function)."""
    tree = _parsed(path)
    out: set[str] = set()
    for node in tree.body:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        # our modules by their names in the repository (caps.x), installed as ctxbudget.caps.x
        names = [n.removeprefix("ctxbudget.") for n in names]
        out.update(n for n in names if n in modules)
    return out


def test_caps_imports_nothing_of_ours_and_memory_nothing_from_proxy() -> None:
    modules = _modules()
    for name, path in modules.items():
        for target in _imports(path, modules):
            if name.startswith("caps"):
                assert target.startswith("caps"), f"{name} imports {target}"
            if name.startswith("memory"):
                assert not target.startswith("proxy"), f"{name} imports {target}"


def test_no_import_cycles() -> None:
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    done: set[str] = set()

    def visit(name: str, stack: list[str]) -> None:
        if name in stack:
            cycle = stack[stack.index(name) :] + [name]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        for target in sorted(graph.get(name, ())):
            # a package's __init__ importing its own modules is how it states its surface
            if not name.startswith(target + ".") and not target.startswith(name + "."):
                visit(target, [*stack, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


ROOMS = {
    # foundations every room may use
    "proxy.errors": 0,
    "proxy.tokens": 0,
    "proxy.urls": 0,
    "proxy.sse": 0,
    "proxy.breaker": 0,
    "proxy.config": 1,
    "proxy.upstream": 2,
    "proxy.cache": 2,
    "proxy.wire": 3,
    "proxy.report": 3,
    "proxy.access": 4,
    "proxy.stores": 4,
    "proxy.state": 5,
    "proxy.routes": 6,
    "proxy.pipeline": 7,
    "proxy.app": 8,
    "proxy.demo": 9,
    "proxy.cli": 10,
}
"""proxy's rooms, lowest first (docs/architecture.md draws them): a module imports its own room
and rooms below it, never a room above or beside it on the same floor."""


def _room(name: str) -> str:
    return next(r for r in sorted(ROOMS, key=len, reverse=True) if name.startswith(r))


def test_every_proxy_module_is_in_a_room() -> None:
    for name in _modules():
        if name.startswith("proxy."):
            assert any(name == r or name.startswith(r + ".") for r in ROOMS), name


def test_rooms_import_only_downward() -> None:
    modules = _modules()
    wrong = []
    for name, path in modules.items():
        if not name.startswith("proxy."):
            continue
        room = _room(name)
        for target in _imports(path, modules):
            if not target.startswith("proxy.") or _room(target) == room:
                continue
            if ROOMS[_room(target)] >= ROOMS[room]:
                wrong.append(f"{name} imports {target}")
    assert not wrong, "\n".join(wrong)


def _bare_imports(path: Path) -> list[str]:
    """Imports of `caps`, `memory` or `proxy` by their top-level names, anywhere in `path`."""
    found = []
    for node in ast.walk(_parsed(path)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        found += [
            f"{path.relative_to(ROOT)}:{node.lineno} {n}"
            for n in names
            if n.split(".")[0] in PACKAGES
        ]
    return found


def test_everything_imports_our_packages_by_their_installed_names() -> None:
    """They install as ctxbudget.caps, ctxbudget.memory and ctxbudget.proxy (issue 36): an
    import of a bare `proxy` works only in the checkout, and would load a second copy of every
    module beside the installed one (two registries, two sets of caches)."""
    trees = [*PACKAGES, "tests", "bench"]
    paths = [p for tree in trees for p in sorted((ROOT / tree).rglob("*.py"))]
    wrong = [found for path in paths for found in _bare_imports(path)]
    assert not wrong, "\n".join(wrong)


def test_pyproject_lists_every_package_by_its_installed_name() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = sorted(
        "ctxbudget." + ".".join(init.parent.relative_to(ROOT).parts)
        for package in PACKAGES
        for init in (ROOT / package).rglob("__init__.py")
    )
    assert sorted(project["packages"]) == on_disk
    assert project["package-dir"] == {f"ctxbudget.{p}": p for p in PACKAGES}
