"""Imports in the core go one way: no cycle among its modules, and every import between its
top-level packages (and top-level modules) points down the layer order declared here.

The graph is read from the source with ``ast``; nothing is imported, so the test is fast and sees
every ``import`` statement, at module level and inside functions alike (an import run only when
a function is called still ties the two modules together). Left out:

* imports under ``if TYPE_CHECKING:``: they never run, and a type hint may name what sits above;
* dynamic imports (``importlib.import_module`` of a string, plugin entry points, the lazy
  ``__getattr__`` of a package): they are data, not import statements.

An edge goes to the module imported: ``import a.b`` and ``from a.b import name`` to ``a.b``,
``from a import b`` to ``a.b`` when that is a module. Importing ``a.b`` also runs ``a``'s
``__init__``; that one's own imports are edges of the package ``a`` like any other.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[1] / "src" / "rlweave"

#: The core's top-level packages and modules ("units"), lowest layer first. A unit may import
#: units of lower layers only, never one of a higher layer or of its own layer. Every unit is
#: listed, so a new package or module gets its place on purpose.
LAYERS: tuple[tuple[str, ...], ...] = (
    # "targets": import targets and the references to a user's objects, stdlib only
    ("targets",),
    # leaves: import no other unit but targets ("rlweave" is the package's own __init__: version
    # constants; "sandbox": the worker processes that run rewards and tools, stdlib only)
    ("rlweave", "deps", "devices", "residency", "worker_errors", "loggers", "rendezvous", "sandbox"),
    # -- the kernel: contracts, plugins, config, scheduling, the run loop
    ("data",),  # data records (jsonl, parquet, chat) and the batch between roles
    ("weight_sync",),  # transports and the WeightSync service; role handles by duck type only
    ("interfaces",),  # contracts of workers, engines, rollouts, pipelines and algorithms
    ("plugins",),  # hookspecs, record types, plugin manager, algorithms named by import path
    ("rewards",),  # reward functions and the reward set (run in the sandbox)
    ("config",),  # schema, loading and validation (both passes, input checks), run directory
    ("scheduler",),  # roles as worker groups, dispatch, futures; its Ray implementation
    ("runner",),  # the run loop and its utilities
    # -- the toolkits plugins build on
    ("algo_parts", "engine_helpers", "backend_helpers"),  # named loss parts; engine and backend plugins' share
    ("environments",),  # built-in environments of multi-turn rollouts (tools run in the sandbox)
    ("algo_helpers",),  # the RL step toolkit: rollouts, run modes, pipelines, reward sources
    ("testing",),  # helpers and contract suites for plugin authors' tests
    ("commands",),  # generate, export, eval
    ("cli",),  # the rlweave command line
)

#: the kernel: it runs any algorithm and imports none of the RL toolkit
KERNEL = ("data", "weight_sync", "interfaces", "plugins", "config", "scheduler", "runner")
#: the RL toolkit the shipped algorithms share
TOOLKIT = ("algo_parts", "environments", "algo_helpers")
#: pairs of units that must never import each other in this direction (beyond the layer order)
FORBIDDEN = tuple((k, t) for k in KERNEL for t in TOOLKIT) + (("backend_helpers", "runner"),)


@dataclass(frozen=True)
class Edge:
    """``src`` imports ``dst`` (module names) at ``file:line``."""

    src: str
    dst: str
    file: str
    line: int

    def where(self) -> str:
        return f"{self.file}:{self.line}"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit(module: str) -> str:
    """``rlweave.config.schema`` -> ``config``; ``rlweave`` -> ``rlweave``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


_BLOCKS = (ast.stmt, ast.excepthandler, ast.match_case)


def _imports(nodes: Iterable[ast.AST]) -> list[ast.Import | ast.ImportFrom]:
    """The import statements among ``nodes`` and inside their blocks (function and class bodies,
    branches, handlers), except the body of an ``if TYPE_CHECKING:``; expressions hold none."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in (getattr(node.test, "id", None),
                                                               getattr(node.test, "attr", None)):
            found += _imports(node.orelse)
        else:
            found += _imports(c for c in ast.iter_child_nodes(node) if isinstance(c, _BLOCKS))
    return found


def _targets(node: ast.Import | ast.ImportFrom, package: str, modules: set[str]) -> list[str]:
    """Modules (possibly outside the core, possibly missing) that an import statement names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:  # relative: from the package, one level up per extra dot
        parts = package.split(".")
        source = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    return list(dict.fromkeys(f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names))


def read_graph(root: Path, files_from: Path | None = None) -> tuple[set[str], list[Edge], list[Edge]]:
    """``(modules, edges, unresolved)`` of the package at ``root``: every module, every import
    of one of them by another, and imports of ``rlweave`` modules that do not exist. Files are
    named relative to ``files_from`` (default: the folder holding ``root``)."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    modules = set(files)
    edges, unresolved = [], []
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        rel = str(path.relative_to(files_from or root.parent))
        for node in _imports(tree.body):
            for target in _targets(node, package, modules):
                if target != "rlweave" and not target.startswith("rlweave."):
                    continue
                edge = Edge(name, target, rel, node.lineno)
                if target not in modules:
                    unresolved.append(edge)
                elif target != name:
                    edges.append(edge)
    return modules, edges, unresolved


def find_cycle(edges: list[Edge]) -> list[Edge] | None:
    """The edges of one cycle of the graph, in order, or None when it has none."""
    out: dict[str, list[Edge]] = defaultdict(list)
    for e in edges:
        out[e.src].append(e)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(out):
        if start in state:
            continue
        path: list[Edge] = []
        stack = [(start, iter(out[start]))]
        state[start] = 1
        while stack:
            node, it = stack[-1]
            edge = next(it, None)
            if edge is None:
                state[node] = 2
                stack.pop()
                if path:
                    path.pop()
                continue
            if state.get(edge.dst) == 1:
                first = next(i for i, e in enumerate(path + [edge]) if e.src == edge.dst)
                return (path + [edge])[first:]
            if edge.dst not in state:
                state[edge.dst] = 1
                path.append(edge)
                stack.append((edge.dst, iter(out[edge.dst])))
    return None


def layer_violations(edges: list[Edge], layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """One line per import between two units that does not point to a lower layer."""
    rank = {u: i for i, layer in enumerate(layers) for u in layer}
    bad = []
    for e in edges:
        a, b = unit(e.src), unit(e.dst)
        if a != b and rank[a] <= rank[b]:
            bad.append(f"{e.where()}: {e.src} imports {e.dst}: {a} (layer {rank[a]}) may not import {b} "
                       f"(layer {rank[b]})")
    return bad


def describe(cycle: list[Edge]) -> str:
    return cycle[0].src + "".join(f"\n  -> {e.dst}  ({e.where()})" for e in cycle)


@lru_cache(maxsize=1)
def core_graph() -> tuple[set[str], list[Edge], list[Edge]]:
    return read_graph(CORE, files_from=CORE.parents[2])


def test_the_graph_covers_the_core():
    modules, edges, unresolved = core_graph()
    assert len(modules) > 100 and "rlweave.config.schema" in modules
    pairs = {(e.src, e.dst) for e in edges}
    assert ("rlweave.cli", "rlweave.commands.evaluate") in pairs  # ``from rlweave.commands import evaluate``
    assert ("rlweave.plugins.user_algorithm", "rlweave.interfaces.algorithm") in pairs  # inside a function
    # weight_sync.auto names RoleHandle for type hints only, under ``if TYPE_CHECKING:``
    assert ("rlweave.weight_sync.auto", "rlweave.scheduler.handle") not in pairs
    assert not unresolved, "imports of missing modules:\n" + "\n".join(f"{e.where()}: {e.dst}" for e in unresolved)


def test_every_unit_has_one_layer():
    modules, _, _ = core_graph()
    listed = [u for layer in LAYERS for u in layer]
    assert len(listed) == len(set(listed)), "a unit is listed twice in LAYERS"
    present = {unit(m) for m in modules}
    assert present - set(listed) == set(), "units without a layer: add them to LAYERS"
    assert set(listed) - present == set(), "LAYERS names units that no longer exist"


def test_no_cycle_among_core_modules():
    _, edges, _ = core_graph()
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle among core modules:\n" + describe(cycle)


def test_imports_between_units_point_down_the_layers():
    _, edges, _ = core_graph()
    bad = layer_violations(edges, LAYERS)
    assert not bad, "imports against the layer order (lowest first: " + " < ".join(
        "/".join(layer) for layer in LAYERS) + "):\n" + "\n".join(bad)


def forbidden_imports(edges: list[Edge], forbidden: tuple[tuple[str, str], ...]) -> list[str]:
    """One line per import of a unit by one that must never import it."""
    pairs = set(forbidden)
    return [f"{e.where()}: {e.src} imports {e.dst}: {unit(e.src)} may never import {unit(e.dst)}"
            for e in edges if (unit(e.src), unit(e.dst)) in pairs]


def test_the_kernel_imports_none_of_the_toolkit_and_backend_helpers_no_runner():
    _, edges, _ = core_graph()
    bad = forbidden_imports(edges, FORBIDDEN)
    assert not bad, "imports the layering forbids:\n" + "\n".join(bad)


def test_no_cycle_among_units():
    _, edges, _ = core_graph()
    between = sorted({(unit(e.src), unit(e.dst)): e for e in edges if unit(e.src) != unit(e.dst)}.items())
    cycle = find_cycle([Edge(a, b, e.file, e.line) for (a, b), e in between])
    assert cycle is None, "import cycle among the core's packages:\n" + describe(cycle)


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root / "rlweave"


@pytest.fixture
def planted(tmp_path) -> Path:
    """A tiny ``rlweave`` with a cycle through a function-level import, an upward import, an
    import of a missing module, and an exempt TYPE_CHECKING import."""
    return _write(tmp_path, {
        "rlweave/__init__.py": "",
        "rlweave/low/__init__.py": "",
        "rlweave/low/a.py": "def f():\n    from rlweave.low import b\n",
        "rlweave/low/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import rlweave.high\n"
                            "from .c import x\n",
        "rlweave/low/c.py": "import rlweave.low.a\nimport rlweave.high.gone\n",
        "rlweave/high/__init__.py": "from rlweave.low.c import x\n",
    })


def test_checks_find_what_is_planted(planted):
    _, edges, unresolved = read_graph(planted)
    cycle = find_cycle(edges)
    assert cycle is not None and {e.src for e in cycle} == {"rlweave.low.a", "rlweave.low.b", "rlweave.low.c"}
    assert [(e.file, e.line) for e in cycle if e.src == "rlweave.low.a"] == [("rlweave/low/a.py", 2)]
    assert [e.dst for e in unresolved] == ["rlweave.high.gone"]
    assert not any(e.dst == "rlweave.high" for e in edges)  # the TYPE_CHECKING import
    layers = (("rlweave",), ("low",), ("high",))
    assert layer_violations(edges, layers) == []
    flipped = layer_violations(edges, (("rlweave",), ("high",), ("low",)))
    assert flipped == [("rlweave/high/__init__.py:1: rlweave.high imports rlweave.low.c: high (layer 1) may not import "
                        "low (layer 2)")]
    assert find_cycle([e for e in edges if e.src != "rlweave.low.c"]) is None


def test_a_wrong_way_import_into_the_toolkit_fails_the_layering(tmp_path):
    """The real core plus one planted module: the runner importing the RL toolkit."""
    import shutil

    root = tmp_path / "rlweave"
    shutil.copytree(CORE, root, ignore=shutil.ignore_patterns("__pycache__"))
    _, edges, _ = read_graph(root)
    assert layer_violations(edges, LAYERS) == [] and forbidden_imports(edges, FORBIDDEN) == []
    (root / "runner" / "shortcut.py").write_text("from rlweave.algo_helpers.experience import ExperienceKit\n")
    _, edges, _ = read_graph(root)
    assert forbidden_imports(edges, FORBIDDEN) == [
        "rlweave/runner/shortcut.py:1: rlweave.runner.shortcut imports rlweave.algo_helpers.experience: runner may "
        "never import algo_helpers"]
    assert layer_violations(edges, LAYERS) == [
        "rlweave/runner/shortcut.py:1: rlweave.runner.shortcut imports rlweave.algo_helpers.experience: runner "
        f"(layer {[i for i, u in enumerate(LAYERS) if 'runner' in u][0]}) may not import algo_helpers "
        f"(layer {[i for i, u in enumerate(LAYERS) if 'algo_helpers' in u][0]})"]
