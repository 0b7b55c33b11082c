"""The import graph of ``stages`` and ``curation_dagster`` has no cycle, function-level imports
included: each module can be read (and loaded) after the modules it imports.

The graph is read with ``ast`` from the source files, so a new module is covered without being
named here. An edge ``a -> b`` is any ``import b`` / ``from b import x`` in ``a``, at module level
or inside a function, ``b`` being a module of these packages (``from pkg import mod`` counts as an
import of ``pkg.mod``). Imports under ``if TYPE_CHECKING:`` never run and are left out. Importing
``pkg.mod`` runs ``pkg/__init__.py`` first, which is not an edge: a package's ``__init__`` that
imports its own modules would otherwise make a cycle of every module that imports one of them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("stages", "curation_dagster")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of the packages, by dotted name."""
    return {_module(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported(tree: ast.AST, package: str) -> Iterator[str]:
    """Dotted names ``tree`` imports (and, for ``from a import b``, ``a.b`` too), anywhere but
    under ``if TYPE_CHECKING:``; ``package`` resolves relative imports."""
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _type_checking(node.test):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)
        todo.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    """{module: the modules of the packages it imports}."""
    mods = modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set(_imported(ast.parse(path.read_text(), str(path)), package))
        graph[name] = {t for t in targets if t in mods and t != name}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph``, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # the graph is a few hundred modules: recursion depth is no issue
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
            out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One cycle through ``component``'s first module, for the message."""
    members, start = set(component), component[0]
    path, seen = [start], {start}
    while True:
        nxt = sorted(graph[path[-1]] & members)
        back = start if start in nxt else next((n for n in nxt if n not in seen), None)
        if back is None or back == start:
            return [*path, start]
        path.append(back)
        seen.add(back)


def test_the_walk_sees_function_level_imports() -> None:
    source = "import a\nif TYPE_CHECKING:\n    import t\ndef f():\n    from b.c import d\n    from . import e\n"
    tree = ast.parse(source)
    assert set(_imported(tree, "pkg.sub")) == {"a", "b.c", "b.c.d", "pkg.sub", "pkg.sub.e"}
    assert strongly_connected({"x": {"y"}, "y": {"x"}, "z": {"x"}}) == [["x", "y"], ["z"]]


def test_no_import_cycle() -> None:
    graph = import_graph()
    assert {"stages", "curation_dagster"} <= set(graph)
    cycles = [c for c in strongly_connected(graph) if len(c) > 1]
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(_cycle(graph, c)) for c in cycles)


def test_programs_import_the_catalog_and_task_types_not_the_planner() -> None:
    """A program imports what it needs to run (catalog, task types, store), never the modules
    that load programs by name: the direction is plan/execute -> program, not back."""
    graph = import_graph()
    programs = [m for m in graph if m.startswith("stages.programs.")]
    assert len(programs) == 15
    for program in programs:
        assert not graph[program] & {"stages.resolve", "stages.execute"}, program


def test_nothing_under_tools_imports_dagster() -> None:
    """``curation_dagster.tools`` answers questions about a crawl's outputs with no Dagster: no
    module under it imports ``dagster`` or a ``dagster_*`` package (at module level or in a
    function), nor a module of ``curation_dagster`` outside ``tools/`` (those import Dagster)."""
    mods = modules()
    tools = [name for name in mods if name.startswith("curation_dagster.tools.")]
    assert {"curation_dagster.tools.explain", "curation_dagster.tools.lineage", "curation_dagster.tools.profile",
            "curation_dagster.tools.sample", "curation_dagster.tools.sizing"} <= set(tools)
    for name in tools:
        path = mods[name]
        imported = set(_imported(ast.parse(path.read_text(), str(path)), name.rpartition(".")[0]))
        dagster = {m for m in imported if m.split(".")[0] == "dagster" or m.startswith("dagster_")}
        outside = {m for m in imported if m.startswith("curation_dagster.")
                   and not m.startswith("curation_dagster.tools")}
        assert not dagster and not outside, (name, sorted(dagster | outside))


def test_the_payloads_tests_import_no_orchestrator() -> None:
    """``tests/stages`` tests the payload alone: none of its modules imports ``curation_dagster``
    (the tests that drive ``curate`` or the Dagster definitions are in ``tests/e2e`` and
    ``tests/curation_dagster``)."""
    files = sorted((ROOT / "tests" / "stages").rglob("*.py"))
    assert len(files) > 30
    for path in files:
        imported = set(_imported(ast.parse(path.read_text(), str(path)), "tests.stages"))
        assert not {m for m in imported if m.split(".")[0] == "curation_dagster"}, path
