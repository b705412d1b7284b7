"""The package layering stays as designed: no import cycles, and a leaf functional core.

An AST walk over ``fedrl_envs``, ``fedrl_wrappers``, ``fedrl_algos`` and the alias package ``wrappers``
collects every import, at module level, *inside functions* and *under* ``if TYPE_CHECKING:`` (such
an import never runs, but a module that needs another's types for its hints still depends on it: a
cycle hidden there is a cycle of the design), and resolves it to a module of the project. Then:

* the graph "module A imports module B" has no cycle;
* no module of ``fedrl_algos.core`` imports anything of ``fedrl_algos`` outside ``core``;
* ``fedrl_envs`` imports nothing else of fedrl; ``fedrl_wrappers`` does not import ``fedrl_algos``
  (envs → fedrl_wrappers → core → policies → algorithms → reproduce/CLI);
* no library module imports ``wrappers``, the public alias of ``fedrl_wrappers``: a user's own
  module of that name must not break fedrl; ``wrappers`` itself imports ``fedrl_wrappers`` only;
* no algorithm package imports another one.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fedrl_envs", "fedrl_wrappers", "fedrl_algos", "wrappers")
#: the packages of the library proper (``wrappers`` is only an alias of ``fedrl_wrappers``)
LIBRARY = ("fedrl_envs", "fedrl_wrappers", "fedrl_algos")
#: one package per algorithm; none may import another
ALGORITHM_PACKAGES = (
    "fedrl_algos.per_fedavg_pg",
    "fedrl_algos.fedavg_pg",
    "fedrl_algos.independent_pg",
    "fedrl_algos.mfpo",
    "fedrl_algos.fedpg_br",
    "fedrl_algos.fedavg_sb3",
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    """Every module of the three packages by dotted name."""
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _imports(tree: ast.AST, module: str, is_package: bool, modules: dict[str, Path]) -> set[str]:
    """Project modules that ``module`` imports anywhere, ``if TYPE_CHECKING:`` blocks included."""
    found: set[str] = set()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = resolve(alias.name)
                if target:
                    found.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            for alias in node.names:
                # ``from pkg import submodule`` imports the submodule; ``from mod import name`` the module
                target = resolve(f"{source}.{alias.name}") if f"{source}.{alias.name}" in modules else resolve(source)
                if target:
                    found.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(module)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {
        name: _imports(ast.parse(path.read_text()), name, path.name == "__init__.py", modules)
        for name, path in modules.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = [0]

    def strongconnect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strongconnect(w)
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
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return components


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_no_import_cycles() -> None:
    cycles = _cycles(import_graph())
    assert not cycles, "import cycles (counting imports inside functions and under TYPE_CHECKING): " + "; ".join(
        " <-> ".join(c) for c in cycles
    )


def test_core_is_a_leaf() -> None:
    bad = [
        f"{m} imports {t}"
        for m, targets in import_graph().items()
        if _within(m, "fedrl_algos.core")
        for t in sorted(targets)
        if _within(t, "fedrl_algos") and not _within(t, "fedrl_algos.core")
    ]
    assert not bad, "fedrl_algos.core must import nothing of fedrl_algos outside core: " + "; ".join(bad)


def test_lower_layers_do_not_import_upper_ones() -> None:
    graph = import_graph()
    bad = [
        f"{m} imports {t}"
        for m, targets in graph.items()
        for t in sorted(targets)
        if (_within(m, "fedrl_envs") and not _within(t, "fedrl_envs"))
        or (_within(m, "fedrl_wrappers") and _within(t, "fedrl_algos"))
    ]
    assert not bad, "; ".join(bad)


def test_the_library_never_imports_the_wrappers_alias() -> None:
    graph = import_graph()
    bad = [
        f"{m} imports {t}"
        for m, targets in graph.items()
        for t in sorted(targets)
        if any(_within(m, pkg) for pkg in LIBRARY) and _within(t, "wrappers")
    ]
    assert not bad, "fedrl's own modules must import fedrl_wrappers, not its alias wrappers: " + "; ".join(bad)
    alias = [f"{m} imports {t}" for m, targets in graph.items() if _within(m, "wrappers") for t in sorted(targets) if not _within(t, "fedrl_wrappers")]
    assert not alias, "the alias package wrappers re-exports fedrl_wrappers only: " + "; ".join(alias)
    # the walk sees the alias modules and their imports (the checks above are not vacuous)
    assert graph["wrappers.federated"] == {"fedrl_wrappers.federated"}


#: what may sit at the top of ``fedrl_algos``: the library's packages (the algorithms, their shared
#: layers, Flower, the papers' experiments, the benchmarks, ``fedrl train``'s runs, the command line) and no module
TOP_LEVEL_PACKAGES = {
    "common", "core", "policies", "flower", "reproduce", "bench", "cli", "zoo",
    *(name.rpartition(".")[2] for name in ALGORITHM_PACKAGES),
}
TOP_LEVEL_MODULES: set[str] = set()


def test_the_top_of_fedrl_algos_shows_the_library() -> None:
    root = ROOT / "fedrl_algos"
    packages = {p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in root.glob("*.py")} - {"__init__"}
    assert packages - TOP_LEVEL_PACKAGES == set(), f"packages not in TOP_LEVEL_PACKAGES: {sorted(packages - TOP_LEVEL_PACKAGES)}"
    assert modules - TOP_LEVEL_MODULES == set(), (
        f"top-level modules of fedrl_algos outside the allowed list: {sorted(modules - TOP_LEVEL_MODULES)} "
        "(benchmarks go in fedrl_algos/bench/, research diagnostics under fedrl_algos/reproduce/)"
    )
    assert {"bench", "cli"} <= packages  # the walk sees the tree


def test_algorithms_do_not_import_each_other() -> None:
    graph = import_graph()
    bad = [
        f"{m} imports {t}"
        for m, targets in graph.items()
        for t in sorted(targets)
        for a in ALGORITHM_PACKAGES
        for b in ALGORITHM_PACKAGES
        if a != b and _within(m, a) and _within(t, b)
    ]
    assert not bad, "; ".join(bad)


#: the figures of ``fedrl reproduce`` (and the learning curves of ``fedrl train``/``fedrl plot``,
#: ``plots.curves``): the only modules that import matplotlib
PLOTTING = "fedrl_algos.reproduce.plots"


def test_only_the_plotting_modules_import_matplotlib() -> None:
    """The experiments compute, the figure modules draw: matplotlib (imported anywhere in a module,
    inside functions too) belongs to ``fedrl_algos.reproduce.plots`` alone."""
    modules = project_modules()
    known = {**modules, "matplotlib": Path("matplotlib")}
    importers = {
        name for name, path in modules.items()
        if "matplotlib" in _imports(ast.parse(path.read_text()), name, path.name == "__init__.py", known)
    }
    bad = sorted(m for m in importers if not _within(m, PLOTTING))
    assert not bad, f"only {PLOTTING} may import matplotlib; also imported by: {bad}"
    assert f"{PLOTTING}.neural" in importers  # the walk sees the plotting modules' imports


def test_the_plotting_modules_take_results_as_data() -> None:
    """The figure modules sit below the experiments: they import none of them (an experiment's ``plot``
    hands its records to them), only the shared helpers and the environments (a figure draws the goals)."""
    allowed = (PLOTTING, "fedrl_algos.reproduce.common", "fedrl_algos.reproduce.parallel", "fedrl_envs")
    graph = import_graph()
    bad = [f"{m} imports {t}" for m, targets in graph.items() if _within(m, PLOTTING)
           for t in sorted(targets) if not any(_within(t, a) for a in allowed)]
    assert not bad, "; ".join(bad)
    assert graph[f"{PLOTTING}.partial"] >= {PLOTTING, f"{PLOTTING}.tabular"}


def test_the_walk_sees_function_level_and_type_checking_imports() -> None:
    """The checker itself: an import inside a function counts, and so does one under TYPE_CHECKING."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "def f():\n    from pkg.b import x\n"
        "if TYPE_CHECKING:\n    import pkg.c\nelse:\n    import pkg.d\n"
        "if typing.TYPE_CHECKING:\n    from pkg.e import Y\n"
    )
    modules = {name: Path(".") for name in ("pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d", "pkg.e")}
    assert _imports(ast.parse(source), "pkg.a", False, modules) == {"pkg.b", "pkg.c", "pkg.d", "pkg.e"}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
