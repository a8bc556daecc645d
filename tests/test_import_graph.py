"""The layout's import rules (DESIGN.md, "Layout"), read from the source with ``ast``: no cycle
among module-level imports and none hidden in a function, the two sides never import each other,
``tasks/`` imports no side, only ``cli/`` imports ``cli/``, only ``queues/broker/`` imports kombu
and one module registers Lua scripts. Nothing is imported: the rules hold for the text.

Cycles are read from module-level imports (those that run when a module is imported; not in a
function, not under ``if TYPE_CHECKING:``); the rules of who may import whom count every import,
wherever it is written."""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "sluice"


@dataclass(frozen=True)
class Import:
    """One import statement's target, resolved to a dotted name, and where it was written."""

    importer: str
    target: str  # a module of sluice, or the first name of another distribution ("kombu")
    line: int
    module_level: bool  # runs when the importer is imported (not in a function, not TYPE_CHECKING)
    type_checking: bool

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} imports {self.target}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))}


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(body: list[ast.stmt], in_function: bool, type_checking: bool
                ) -> Iterator[tuple[ast.stmt, bool, bool]]:
    """Every statement, with whether it is inside a function and inside ``if TYPE_CHECKING:``."""
    for node in body:
        yield node, in_function, type_checking
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _statements(node.body, True, type_checking)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _statements(node.body, in_function, True)
            yield from _statements(node.orelse, in_function, type_checking)
        else:  # blocks that run when their statement does: if, try, with, for, while, match, class
            for field in ("body", "orelse", "finalbody"):
                yield from _statements(getattr(node, field, []), in_function, type_checking)
            for clause in [*getattr(node, "handlers", []), *getattr(node, "cases", [])]:
                yield from _statements(clause.body, in_function, type_checking)


def _targets(importer: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The modules an import statement loads: the named module, or for ``from x import y``, ``x.y``
    where ``y`` is a module of sluice and ``x`` otherwise. Other distributions by their first name."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    if node.level:
        base = importer if _is_package(importer) else importer.rpartition(".")[0]
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        source = f"{base}.{node.module}" if node.module else base
    else:
        source = node.module or ""
    for alias in node.names:
        yield f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source


def _imports() -> list[Import]:
    found = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        for node, in_function, type_checking in _statements(tree.body, False, False):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(module, node):
                    if not target.startswith(f"{PACKAGE}.") and target != PACKAGE:
                        target = target.partition(".")[0]
                    found.append(Import(module, target, node.lineno, not in_function and not type_checking,
                                        type_checking))
    return found


IMPORTS = _imports()


def _loaded(importer: str, target: str, modules: Collection[str]) -> list[str]:
    """The modules importing ``target`` runs, from ``importer``: the target and each package above
    it, less the packages above the importer (already importing when the importer runs)."""
    parts = target.split(".")
    chain = [".".join(parts[: i + 1]) for i in range(len(parts))]
    mine = importer.split(".")
    ancestors = {".".join(mine[:i]) for i in range(1, len(mine) + 1)}
    return [m for m in chain if m in modules and m not in ancestors]


def _graph(imports: list[Import], modules: Collection[str] = MODULES.keys()) -> dict[str, dict[str, Import]]:
    graph: dict[str, dict[str, Import]] = {m: {} for m in modules}
    for imp in imports:
        for loaded in _loaded(imp.importer, imp.target, modules):
            graph[imp.importer].setdefault(loaded, imp)
    return graph


def _cycles(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def _describe(component: list[str], graph: dict[str, dict[str, Import]]) -> str:
    members = set(component)
    edges = [imp for m in component for target, imp in graph[m].items() if target in members]
    return f"{len(component)} modules: " + _listing(edges).replace("\n", "; ")


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def _listing(imports: list[Import]) -> str:
    """One line per offending import (a statement naming several members of a module counts once)."""
    unique = {(imp.importer, imp.line, imp.target): str(imp) for imp in imports}
    return "\n".join(unique[key] for key in sorted(unique))


MODULE_LEVEL = [imp for imp in IMPORTS if imp.module_level]


def test_the_import_graph_is_read() -> None:
    """The reader sees the package (a rule over nothing would pass on nothing)."""
    assert "sluice.app" in MODULES and len(MODULES) > 50
    assert any(imp.importer == "sluice.app" and imp.target == "sluice.compute" for imp in MODULE_LEVEL)


def test_a_cycle_through_a_package_init_is_found() -> None:
    """The shape of the cycle this test was written for: a package's ``__init__`` imports a module
    that imports a module of another package, which imports a submodule of the first package (so
    the first package's ``__init__`` runs, half-loaded, in the middle of itself)."""
    modules = {"p", "p.function", "p.packages", "q", "q.call_task"}
    edges = [Import("p", "p.function", 1, True, False), Import("p.function", "q.call_task", 1, True, False),
             Import("q.call_task", "p.packages", 1, True, False)]
    cycle, = _cycles(_graph(edges, modules))
    assert cycle == ["p", "p.function", "q.call_task"]
    assert not _cycles(_graph(edges[1:], modules))  # the package's __init__ imports nothing: no cycle


def test_no_cycle_among_module_level_imports() -> None:
    """Importing any module of sluice first works: no module needs, while it loads, one that
    needs it back (a cycle holds only by the order modules happen to be imported in)."""
    graph = _graph(MODULE_LEVEL)
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(_describe(c, graph) for c in cycles)


def test_no_import_is_placed_in_a_function_to_hide_a_cycle() -> None:
    """An import of sluice written inside a function would not close a cycle at module level:
    lazy imports are only for optional extras (other distributions) and CLI start-up time."""
    graph = _graph(MODULE_LEVEL)
    acyclic = not _cycles(graph)
    hiding: list[Import] = []
    for imp in IMPORTS:
        if imp.module_level or imp.type_checking or not _in(imp.target, PACKAGE):
            continue
        trial = _graph([*MODULE_LEVEL, Import(imp.importer, imp.target, imp.line, True, False)])
        if acyclic and _cycles(trial):
            hiding.append(imp)
    assert acyclic, "module-level cycles first (test_no_cycle_among_module_level_imports)"
    assert not hiding, "imports in functions that hide a cycle:\n" + _listing(hiding)


SIDES = [("sluice.client", "sluice.workers"), ("sluice.workers", "sluice.client")]


@pytest.mark.parametrize(("side", "other"), SIDES, ids=["client-to-workers", "workers-to-client"])
def test_the_two_sides_never_import_each_other(side: str, other: str) -> None:
    """The caller's side and the worker's side meet only in what both import (``tasks/``, the
    core, ``queues/``): no import from one into the other, wherever it is written."""
    crossing = [imp for imp in IMPORTS if _in(imp.importer, side) and _in(imp.target, other)]
    assert not crossing, f"{side} imports {other}:\n" + _listing(crossing)


FORBIDDEN_TO_TASKS = ["sluice.client", "sluice.workers", "sluice.deploy", "sluice.assets", "sluice.cli"]


@pytest.mark.parametrize("package", FORBIDDEN_TO_TASKS)
def test_tasks_import_no_side(package: str) -> None:
    """``tasks/`` (what a task is and what travels with it) is imported by both sides and imports
    neither, nor a capability or the command line."""
    upward = [imp for imp in IMPORTS if _in(imp.importer, "sluice.tasks") and _in(imp.target, package)]
    assert not upward, f"sluice.tasks imports {package}:\n" + _listing(upward)


#: ``python -m sluice`` is the command itself, as the console script is.
ENTRY_POINTS = {"sluice.__main__"}


def test_nothing_outside_cli_imports_cli() -> None:
    """The command line sits on top: its helpers and groups are imported by no other package."""
    inward = [imp for imp in IMPORTS if _in(imp.target, "sluice.cli") and not _in(imp.importer, "sluice.cli")
              and imp.importer not in ENTRY_POINTS]
    assert not inward, "imports of sluice.cli from outside it:\n" + _listing(inward)


BROKER = "sluice.queues.broker"


def test_only_the_broker_subpackage_imports_kombu() -> None:
    """Every line that knows kombu is in ``queues/broker/``."""
    outside = [imp for imp in IMPORTS if imp.target == "kombu" and not _in(imp.importer, BROKER)]
    assert not outside, f"kombu imported outside {BROKER}:\n" + _listing(outside)


def test_only_the_broker_subpackage_imports_celerys_redis_backend() -> None:
    """Celery's Redis layout is the broker's too: its Redis result backend is subclassed there only."""
    outside = [f"{module}:{node.lineno}" for module, path in MODULES.items() if not _in(module, BROKER)
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("celery.backends.redis")]
    assert not outside, f"celery.backends.redis imported outside {BROKER}: {outside}"


#: The calls that hand a Lua script to Redis (redis-py's script API).
SCRIPT_CALLS = {"register_script", "script_load", "eval", "evalsha", "eval_ro", "evalsha_ro"}


def _registering(module: str) -> list[str]:
    tree = ast.parse(MODULES[module].read_text())
    return [f"{module}:{node.lineno} calls {node.func.attr}" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in SCRIPT_CALLS]


def test_one_module_registers_lua_scripts() -> None:
    """Lua scripts are loaded and registered by one script registry; every other module asks it."""
    calls = {module: found for module in MODULES if (found := _registering(module))}
    assert set(calls) == {f"{BROKER}.scripts"}, "Lua scripts registered outside the one registry:\n" + "\n".join(
        line for found in calls.values() for line in found)
    scripts_dir = SRC / PACKAGE / "queues" / "broker" / "lua"
    assert {script.parent for script in (SRC / PACKAGE).rglob("*.lua")} == {scripts_dir}
