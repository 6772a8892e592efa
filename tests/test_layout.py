"""The dependency rules of DESIGN.md, checked on the source: caps imports nothing of ours,
memory nothing from proxy, and no package has an import cycle."""

from __future__ import annotations

import ast
import functools
import re
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


_BARE = re.compile(r"^[ \t]*(?:import|from)[ \t][^\n]*(?<![\w.])(?:caps|memory|proxy)\b", re.M)
"""A line that may import one by its bare name: `import`'s and `from`'s module names are on
their statement's first line. A file with none needs no syntax tree (parsing and walking the
tests' and benches' took ~2 s of the run)."""


def _bare_imports(path: Path) -> list[str]:
    """Imports of `caps`, `memory` or `proxy` by their top-level names, anywhere in `path`."""
    if not _BARE.search(path.read_text()):
        return []
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


_IMMUTABLE_CALLS = frozenset(
    {"frozenset", "tuple", "re.compile", "TypeVar", "object", "os.environ.get", "str.maketrans"}
    | {"field"}
)
"""What a module-level name in `caps` may be made by: values no one can change (a sentinel
`object()`, a compiled pattern, the environment read once at import; `str.maketrans`'s
translation table is a dict only ever read by `str.translate`), and a dataclass's `field`
(its default is per instance)."""
_OK_DECORATORS = frozenset({"overload", "property", "staticmethod", "classmethod", "dataclass"})
"""A decorator of a function or class in `caps`: none that keeps anything (`weighed`,
`functools.cache`, `lru_cache` do)."""


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _constant(node: ast.expr) -> bool:
    """A value that cannot change: a literal, a tuple of them, a name or type alias, an
    expression of them, a lambda, or a call in `_IMMUTABLE_CALLS` (its arguments are used
    once). Never a dict, list or set display or comprehension, nor any other call (a cache
    type, `dict()`, `OrderedDict()`, `LRUCache(...)`)."""
    if isinstance(node, ast.Constant | ast.JoinedStr | ast.Name | ast.Attribute | ast.Lambda):
        return True
    if isinstance(node, ast.Subscript):  # a type alias: dict[str, Any], Literal[...]
        return True
    if isinstance(node, ast.Tuple):
        return all(map(_constant, node.elts))
    if isinstance(node, ast.BinOp):
        return _constant(node.left) and _constant(node.right)
    if isinstance(node, ast.UnaryOp):
        return _constant(node.operand)
    if isinstance(node, ast.BoolOp):
        return all(map(_constant, node.values))
    if isinstance(node, ast.Compare):
        return _constant(node.left) and all(map(_constant, node.comparators))
    if isinstance(node, ast.Call):
        return _dotted(node) in _IMMUTABLE_CALLS
    return False


def _state_in(body: list[ast.stmt], where: str) -> list[str]:
    """What in a module's (or a class's) own body outlives a call: names bound to anything but
    a constant, augmented assignments, `global`, and caching decorators."""
    found = []
    for node in body:
        at = f"{where}:{node.lineno}"
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                continue
            if not _constant(node.value):
                found.append(f"{at} {ast.unparse(node).splitlines()[0]}")
        elif isinstance(node, ast.AugAssign | ast.Global):
            found.append(f"{at} {ast.unparse(node)}")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            for decorator in node.decorator_list:
                if _dotted(decorator).split(".")[-1] not in _OK_DECORATORS:
                    found.append(f"{at} @{ast.unparse(decorator)} {node.name}")
            if isinstance(node, ast.ClassDef):  # class attributes are shared by every instance
                found += _state_in(node.body, where)
        elif isinstance(node, ast.If | ast.Try):
            found += _state_in(node.body + node.orelse, where)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found += [
                f"{where}:{n.lineno} {ast.unparse(n)}"
                for n in ast.walk(node)
                if isinstance(n, ast.Global | ast.Nonlocal)
            ]
    return found


def test_caps_keeps_no_state_between_calls() -> None:
    """DESIGN.md: `caps` is pure functions with no process-global state; what is remembered
    between requests is the caller's (`caps.Memo`, one per app: issue 34). The cache types
    (`caps/_kept.py`) are fine; an instance of one at module level is state, as is any dict,
    list or set a module or class holds, and a caching decorator."""
    found = [
        f
        for name, path in _modules().items()
        if name.split(".")[0] == "caps"
        for f in _state_in(_parsed(path).body, str(path.relative_to(ROOT)))
    ]
    assert not found, "module-level state in caps:\n" + "\n".join(found)
