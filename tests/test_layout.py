"""The dependency rules of DESIGN.md, checked on the source: caps imports nothing of ours,
memory nothing from proxy, and no package has an import cycle."""

from __future__ import annotations

import ast
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


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Our modules `path` imports at import time (not under TYPE_CHECKING or in a function)."""
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in tree.body:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
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
