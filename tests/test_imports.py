"""Dependencies point one way: no module imports one that imports it back, the engine stands below models,
tasks and data, and nothing but `python -m bigbatch` imports the CLI.

Read from the source with `ast` (nothing is imported), counting every import statement: at module level
and inside functions and classes, relative ones resolved, and `from pkg import name` as an import of the
submodule pkg.name when there is one, else of pkg; and `importlib.import_module("pkg.x")` with a literal
name (a cycle dodged so is still a cycle). Importing the root package (`import bigbatch`) is not an
edge: every import of a submodule runs it first anyway.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import deque
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "bigbatch"

Graph = dict[str, dict[str, int]]  # module -> {module it imports: line of its first import statement}


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package folder `root`."""
    out = {}
    for f in sorted(root.rglob("*.py")):
        parts = list(f.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def import_graph(root: Path) -> Graph:
    files = module_files(root)

    def module_of(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: Graph = {}
    for mod, f in files.items():
        package = mod if f.name == "__init__.py" else mod.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
                names = [f"{source}.{a.name}" if f"{source}.{a.name}" in files else source for a in node.names]
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                names = [node.args[0].value]
            else:
                continue
            for target in filter(None, map(module_of, names)):
                if target not in (mod, root.name):
                    edges[target] = min(edges.get(target, node.lineno), node.lineno)
        graph[mod] = edges
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (each sorted): the modules that import
    themselves back, through one another."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = [stack.pop()]
            while component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(components)


def explain_cycle(graph: Graph, component: list[str]) -> str:
    """The modules of a cycle and one shortest chain of imports around it, with the lines they are on."""
    start = component[0]
    path = shortest_path(graph, start, lambda m: m == start, within=set(component))
    return f"{', '.join(component)}: {describe(graph, path)}"


def shortest_path(graph: Graph, start: str, goal, within: set[str] | None = None) -> list[str] | None:
    """The shortest chain of imports from `start` to a module for which goal(module) holds (start itself
    only after at least one import), or None."""
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v]):
            if within is not None and w not in within:
                continue
            if goal(w):
                path = [w, v]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return path[::-1]
            if w not in came_from and w != start:
                came_from[w] = v
                queue.append(w)
    return None


def describe(graph: Graph, path: list[str]) -> str:
    """Each import of a chain with the line it is on, e.g. `a (line 3) -> b (line 9) -> a`."""
    steps = [f"{a} (line {graph[a][b]})" for a, b in zip(path, path[1:])]
    return " -> ".join([*steps, path[-1]])


def test_no_module_imports_one_that_imports_it_back():
    graph = import_graph(PACKAGE)
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(explain_cycle(graph, c) for c in found)


def test_the_engine_imports_nothing_from_models_tasks_or_data():
    graph = import_graph(PACKAGE)
    above = ("bigbatch.models", "bigbatch.tasks", "bigbatch.data")

    def is_above(m: str) -> bool:
        return any(m == a or m.startswith(a + ".") for a in above)

    engine = [m for m in graph if m == "bigbatch.engine" or m.startswith("bigbatch.engine.")]
    assert engine, "no bigbatch.engine modules found: has the package moved?"
    chains = [shortest_path(graph, m, is_above) for m in engine]
    bad = [describe(graph, c) for c in chains if c]
    assert not bad, "the engine reaches models/tasks/data:\n" + "\n".join(bad)


def test_the_metrics_import_nothing_of_the_tasks():
    # The tasks import the metrics (the classify task trains the fcd classifier and hands it to them), so the
    # metrics, imported for real with every submodule, must not load any task, even by name.
    code = (
        "import importlib, pkgutil, sys\n"
        "import bigbatch.metrics as m\n"
        "for info in pkgutil.walk_packages(m.__path__, 'bigbatch.metrics.'):\n"
        "    importlib.import_module(info.name)\n"
        "print(sorted(n for n in sys.modules if n.startswith('bigbatch.tasks')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    # And no import inside a function (which the above does not run) reaches them either.
    graph = import_graph(PACKAGE)
    metrics = [m for m in graph if m.startswith("bigbatch.metrics")]
    chains = [shortest_path(graph, m, lambda t: t.startswith("bigbatch.tasks")) for m in metrics]
    assert not [describe(graph, c) for c in chains if c]


def test_nothing_but_the_commands_entry_imports_the_cli():
    # The launchers start ranks as `python -m bigbatch ...`, so they need not import the CLI that calls them; the
    # `bigbatch` command and `python -m bigbatch` enter by bigbatch.command (a Ctrl-C in its import: one line).
    graph = import_graph(PACKAGE)
    importers = sorted(m for m, edges in graph.items() if "bigbatch.cli" in edges)
    assert importers == ["bigbatch.command"]
    assert sorted(m for m, edges in graph.items() if "bigbatch.command" in edges) == ["bigbatch.__main__"]


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root / "pkg"


def test_the_checker_finds_a_cycle_made_only_of_imports_inside_functions(tmp_path):
    # pkg.a -> pkg.b -> pkg.sub.c -> pkg.a, each import inside a function or method, each of another form.
    files = {
        "pkg/__init__.py": "from pkg.a import f\n",
        "pkg/a.py": "def f():\n    from pkg import b\n    return b\n",
        "pkg/b.py": "class B:\n    def m(self):\n        from .sub import c\n        return c\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "import os\n\n\ndef g():\n    from .. import a\n    return a, os\n",
    }
    graph = import_graph(write_package(tmp_path / "cyclic", files))
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c"]]
    assert explain_cycle(graph, cycles(graph)[0]) == (
        "pkg.a, pkg.b, pkg.sub.c: pkg.a (line 2) -> pkg.b (line 3) -> pkg.sub.c (line 5) -> pkg.a"
    )
    # `from pkg import f` takes a name, not a module: pkg's __init__ runs first for any import, so no cycle.
    files["pkg/sub/c.py"] = "def g():\n    from .. import f\n    return f\n"
    graph = import_graph(write_package(tmp_path / "acyclic", files))
    assert graph["pkg.sub.c"] == {} and cycles(graph) == []
    # importlib.import_module with a literal name is an import all the same.
    files["pkg/sub/c.py"] = "import importlib\n\n\ndef g():\n    return importlib.import_module('pkg.a')\n"
    graph = import_graph(write_package(tmp_path / "by_name", files))
    assert graph["pkg.sub.c"] == {"pkg.a": 5} and cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c"]]


def test_every_dotted_name_the_readme_gives_is_reached_from_import_bigbatch():
    # Found from outside: bigbatch.sampling.draw_latents and bigbatch.models.convert.to_reference, as README writes
    # them, raised AttributeError after a plain `import bigbatch`.
    import re

    names = set(re.findall(r"\bbigbatch(?:\.[A-Za-z_]\w*)+", (PACKAGE.parent / "README.md").read_text()))
    names -= {"bigbatch.json"}  # (a file a run's exports carry, not a name)
    check = (
        "import sys, bigbatch\n"
        f"for name in {sorted(names)!r}:\n"
        "    obj = bigbatch\n"
        "    for part in name.split('.')[1:]:\n"
        "        obj = getattr(obj, part, None)\n"
        "    if obj is None:\n"
        "        print(name)\n"
    )
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert out.returncode == 0 and out.stdout == "", out.stdout + out.stderr
    assert len(names) > 15  # (the README's Python names were read)
