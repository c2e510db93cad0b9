"""flashsplit's modules import one another without circles, lazy imports inside functions included.

The graph is read from the source with ``ast`` (nothing is imported): an edge runs from a module
to every flashsplit module it names in an ``import`` or ``from ... import`` anywhere in its
file. Importing ``pkg.mod`` also runs ``pkg/__init__.py``; those parent edges are left out, since
every package's ``__init__`` re-exports from below it by design.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "flashsplit"

#: Circles being untangled elsewhere; each is listed as the sorted modules of its cycle.


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package ``__init__``), for every .py under flashsplit/."""
    out = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def _absolute(module: str | None, level: int, importer: str, is_package: bool) -> str:
    if not level:
        return module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the flashsplit modules it imports (anywhere in its file)."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, is_package) in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(node.module, node.level, name, is_package)
                submodules = [f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in modules]
                # ``from pkg import mod`` imports the module; ``from pkg import name`` the package.
                targets = submodules + ([source] if len(submodules) < len(node.names) else [])
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    found = circles(import_graph())
    assert not found, "import circles among flashsplit modules: " + "; ".join(" <-> ".join(c) for c in found)


def test_graph_sees_lazy_and_relative_imports(tmp_path):
    """The finder catches a circle closed by a function-level relative import, and reads
    ``from . import mod`` as an edge to the module, not to its package."""
    pkg = tmp_path / PACKAGE / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / PACKAGE / "__init__.py").write_text("from .sub import a\n")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import THING\n")
    (pkg / "b.py").write_text("THING = 1\n\ndef f():\n    from . import a\n    return a\n")
    (pkg / "c.py").write_text("from .. import sub\n")
    graph = import_graph(tmp_path)
    assert graph["flashsplit.sub.b"] == {"flashsplit.sub.a"}
    assert graph["flashsplit.sub.c"] == {"flashsplit.sub"}
    assert circles(graph) == [("flashsplit.sub.a", "flashsplit.sub.b")]


def test_bench_options_is_the_bottom_of_the_bench_package():
    """The option parsers import no other bench module, so the bench reads top-down."""
    graph = import_graph()
    assert not {m for m in graph["flashsplit.bench.options"] if m.startswith("flashsplit.bench")}
