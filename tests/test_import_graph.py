"""The import graph of ``src/prorag``: library packages form no cycle, modules form no module-level cycle,
and no pipeline imports another pipeline.

Every ``import prorag...`` / ``from prorag... import ...`` (and relative import) of every module is read with
``ast`` — module-level ones, those under ``if TYPE_CHECKING:``, and those deferred inside functions — so a
cycle hidden behind a function-level import is still found.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "src"
ROOT = "prorag"
APPLICATION = {"pipelines", "hooks", "pipeline_registry", "settings", "config_loader", "__main__", "cli", "console",
               "use_agent", "methods", "recipes", "assembly", "launch_worker"}
"""Top-level parts of prorag that are the Kedro application, not the library: they may import anything. ``recipes``
compose the stage pipelines; ``methods`` resolves the parameters' ``methods`` map for the config loader, asking each
entry's recipe for its stages; ``assembly`` is the composition root (specs in, objects out), which no library module
imports; ``launch_worker`` is each rank's process under accelerate/torchrun, which builds what it trains there."""
SHARED_PIPELINE_MODULES = {"prorag.pipelines.tags", "prorag.pipelines.parameter_schemas"}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    deferred: bool
    """Inside a function (runs when called) rather than at import time."""
    type_only: bool
    """Under ``if TYPE_CHECKING:`` (never runs)."""
    entry_point: bool = False
    """Under ``if __name__ == "__main__":``: the module run as a script composes what it needs (e.g. the retrieval
    server with the knowledge graph); imported as a library module, it never runs."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SOURCE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted((SOURCE / ROOT).rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The module ``name`` names, or its longest prefix that is a module (``pkg.attr`` -> ``pkg``)."""
    modules = _modules()
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _is_main_guard(test: ast.expr) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.comparators) == 1 and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, node: ast.AST, *, deferred: bool, type_only: bool, is_package: bool,
             entry_point: bool = False) -> list[Edge]:
    edges: list[Edge] = []
    for child in ast.iter_child_nodes(node):
        targets: list[str] = []
        if isinstance(child, ast.Import):
            targets = [alias.name for alias in child.names]
        elif isinstance(child, ast.ImportFrom):
            if child.level:
                package = module if is_package else module.rpartition(".")[0]
                for _ in range(child.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{child.module}" if child.module else package
            else:
                base = child.module or ""
            # ``from pkg import sub`` imports the submodule ``pkg.sub`` when there is one.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in _modules() else base
                       for alias in child.names]
        for target in targets:
            if target == ROOT or target.startswith(ROOT + "."):
                resolved = _resolve(target)
                if resolved is not None and resolved != module:
                    edges.append(Edge(module, resolved, child.lineno, deferred, type_only, entry_point))
        inner_deferred = deferred or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        if isinstance(child, ast.If) and _is_main_guard(child.test) and not deferred:
            edges += _imports(module, ast.Module(body=child.body, type_ignores=[]), deferred=deferred,
                              type_only=type_only, is_package=is_package, entry_point=True)
            edges += _imports(module, ast.Module(body=child.orelse, type_ignores=[]), deferred=deferred,
                              type_only=type_only, is_package=is_package, entry_point=entry_point)
            continue
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for statement in child.body:
                edges += _imports(module, ast.Module(body=[statement], type_ignores=[]), deferred=deferred,
                                  type_only=True, is_package=is_package, entry_point=entry_point)
            for statement in child.orelse:
                edges += _imports(module, ast.Module(body=[statement], type_ignores=[]), deferred=deferred,
                                  type_only=type_only, is_package=is_package, entry_point=entry_point)
            continue
        edges += _imports(module, child, deferred=inner_deferred, type_only=type_only, is_package=is_package,
                          entry_point=entry_point)
    return edges


@cache
def _edges() -> tuple[Edge, ...]:
    found: list[Edge] = []
    for module, path in _modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found += _imports(module, tree, deferred=False, type_only=False, is_package=path.name == "__init__.py")
    return tuple(found)


def _part(module: str) -> str:
    """The top-level part of prorag a module belongs to: ``prorag.kg.graph`` -> ``kg``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def _describe(cycles: list[list[str]], edges: list[Edge], key: Callable[[str], str]) -> str:
    lines = []
    for members in cycles:
        lines.append(" <-> ".join(members))
        inside = set(members)
        for edge in dict.fromkeys(edges):
            if key(edge.source) in inside and key(edge.target) in inside and key(edge.source) != key(edge.target):
                how = "TYPE_CHECKING" if edge.type_only else "deferred" if edge.deferred else "module level"
                lines.append(f"    {edge.source}:{edge.line} -> {edge.target} ({how})")
    return "\n".join(lines)


def _runtime_edges() -> list[Edge]:
    """Every import but those of a ``__main__`` block (a script's own composition, not a dependency)."""
    return [edge for edge in _edges() if not edge.entry_point]


def _is_library(module: str) -> bool:
    return _part(module) not in APPLICATION


def _with_parent_packages(edges: list[Edge]) -> list[Edge]:
    """Importing ``a.b.c`` first runs ``a/__init__.py`` and ``a/b/__init__.py``: an edge to each parent package
    the importer is not itself inside (its own packages are already being imported)."""
    modules = _modules()
    implied = list(edges)
    for edge in edges:
        parts = edge.target.split(".")
        for length in range(2, len(parts)):
            parent = ".".join(parts[:length])
            if parent in modules and not (edge.source == parent or edge.source.startswith(parent + ".")):
                implied.append(Edge(edge.source, parent, edge.line, edge.deferred, edge.type_only))
    return implied


def test_the_walk_sees_the_project() -> None:
    modules = _modules()
    assert {"prorag.kg.graph", "prorag.retrieval.index", "prorag.pipelines.rollout.nodes"} <= set(modules)
    edges = _edges()
    assert any(edge.deferred for edge in edges) and any(edge.type_only for edge in edges)
    assert any(edge.source == "prorag.retrieval.index" and edge.target == "prorag.retrieval.base" for edge in edges)


def test_library_packages_form_no_cycle() -> None:
    """Between the library's top-level packages, counting every import (module level, TYPE_CHECKING, deferred)."""
    edges = [edge for edge in _runtime_edges() if _is_library(edge.source) and _is_library(edge.target)
             and _part(edge.source) != _part(edge.target)]
    graph: dict[str, set[str]] = defaultdict(set)
    for edge in edges:
        graph[_part(edge.source)].add(_part(edge.target))
    cycles = _cycles(graph)
    assert not cycles, "library packages import each other:\n" + _describe(cycles, edges, _part)


def test_library_never_imports_the_application() -> None:
    offenders = [f"{edge.source}:{edge.line} -> {edge.target}" for edge in _runtime_edges()
                 if _is_library(edge.source) and not _is_library(edge.target)]
    assert not offenders, "library modules import the Kedro application:\n" + "\n".join(offenders)


def test_modules_form_no_module_level_cycle() -> None:
    """Import-time cycles between modules: module-level imports (TYPE_CHECKING ones excluded) and the package
    ``__init__`` modules each import runs first."""
    edges = _with_parent_packages([edge for edge in _runtime_edges() if not edge.deferred and not edge.type_only])
    graph: dict[str, set[str]] = defaultdict(set)
    for edge in edges:
        graph[edge.source].add(edge.target)
    cycles = _cycles(graph)
    assert not cycles, "modules import each other at import time:\n" + _describe(cycles, edges, lambda m: m)


def test_library_modules_form_no_cycle_even_through_deferred_imports() -> None:
    """A function-level import that only hides a cycle (``a`` imports ``b``, ``b`` defers importing ``a``)."""
    edges = [edge for edge in _runtime_edges()
             if not edge.type_only and _is_library(edge.source) and _is_library(edge.target)]
    graph: dict[str, set[str]] = defaultdict(set)
    for edge in edges:
        graph[edge.source].add(edge.target)
    cycles = _cycles(graph)
    assert not cycles, "modules import each other (some deferred):\n" + _describe(cycles, edges, lambda m: m)


def _pipeline(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "pipelines" and module not in SHARED_PIPELINE_MODULES \
        and module != f"{ROOT}.pipelines" else None


def test_no_pipeline_imports_another_pipeline() -> None:
    """Pipelines share code through the library (and :data:`SHARED_PIPELINE_MODULES`), never each other's
    modules; composing pipelines is the pipeline registry's job."""
    offenders = []
    for edge in _edges():
        source, target = _pipeline(edge.source), _pipeline(edge.target)
        if source is not None and target is not None and target != source:
            offenders.append(f"{edge.source}:{edge.line} -> {edge.target}")
    assert not offenders, "pipelines import each other:\n" + "\n".join(offenders)


TRL_GRPO = "prorag.training.trl_grpo"
TRL_GRPO_CALLERS = {
    "prorag.training.toy_grpo_run",       # the TRL multi-process demo script
}
"""Who may import the TRL GRPO adapter. The rl node, the launcher and its worker reach it by name through the
trainer-backend registry (:mod:`prorag.training.backends`); a second backend is a sibling that drives the
backend-neutral rollouts (:mod:`prorag.training.grpo`), never this module."""


def test_the_trl_adapter_is_imported_by_its_callers_only():
    importers = {edge.source for edge in _edges() if edge.target == TRL_GRPO and not edge.type_only}
    assert importers <= TRL_GRPO_CALLERS, sorted(importers - TRL_GRPO_CALLERS)
    for sibling in ("prorag.training.dapo", "prorag.training.probe", "prorag.training.grpo",
                    "prorag.training.torch_grpo", "prorag.training.backends", "prorag.rewards", "prorag.agent"):
        assert not any(edge.source.startswith(sibling) and edge.target == TRL_GRPO for edge in _edges()), sibling


def test_the_application_floor_forms_no_cycle_even_through_deferred_imports() -> None:
    """``hooks`` -> ``pipeline_registry`` -> ``settings`` -> ``hooks`` was a circle hidden behind a function-level
    import (issue 45, item 5): the hooks, the registry, the settings and the config loader import downwards only."""
    edges = [edge for edge in _runtime_edges() if not edge.type_only]
    graph: dict[str, set[str]] = defaultdict(set)
    for edge in edges:
        graph[edge.source].add(edge.target)
    cycles = _cycles(graph)
    assert not cycles, "modules import each other (some deferred):\n" + _describe(cycles, edges, lambda m: m)


COMPOSITION_ROOT = "prorag.assembly"
ASSEMBLY_FUNCTIONS = {"build_judge", "build_generator", "build_reward", "RolloutScorer"}
"""What only the composition root calls to turn specs into objects (issue 45, item 2)."""


def test_the_composition_root_is_at_the_top() -> None:
    """No library module reaches up into ``prorag.assembly`` (:func:`test_library_never_imports_the_application`
    holds it to that); the application's nodes, recipes and entry points build through it."""
    assert _part(COMPOSITION_ROOT) in APPLICATION
    importers = {_part(edge.source) for edge in _edges() if edge.target == COMPOSITION_ROOT}
    assert {"pipelines", "launch_worker", "use_agent"} <= importers <= APPLICATION


def test_nodes_and_recipes_build_judges_policies_and_rewards_through_the_root() -> None:
    offenders = []
    for module, path in _modules().items():
        if _part(module) not in {"pipelines", "recipes"}:
            continue
        for statement in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(statement, ast.ImportFrom) and statement.module != COMPOSITION_ROOT:
                offenders += [f"{module}:{statement.lineno} imports {alias.name} from {statement.module}"
                              for alias in statement.names if alias.name in ASSEMBLY_FUNCTIONS]
    assert not offenders, "build these with prorag.assembly:\n" + "\n".join(offenders)
