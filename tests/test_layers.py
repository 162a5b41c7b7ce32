"""The architecture's one written picture: the package's layers, top to bottom. Every import inside asyncrl
(module level, inside functions and under TYPE_CHECKING alike) points down this list or sideways within a
line, and no two modules import each other, directly or round a loop. A new top-level module or package has
to be given its line here.

A new upward import or cycle is a design change: change the picture first (and DEVELOPERS.md with it), or
find the seam that avoids it (a Protocol, an argument, a function moved down).
"""

from __future__ import annotations

import ast
from pathlib import Path

LAYERS = """
cli
launch
commands plan
loop
config
server
agent trainer
models workflow
data
reward
engine report
algo telemetry weights
api cluster
types configlib plugins cache
"""
"""One line per layer, the top first; a name is a top-level module or package of asyncrl."""

PACKAGE = Path(__file__).resolve().parent.parent / "asyncrl"


def layer_of() -> dict[str, int]:
    return {name: i for i, line in enumerate(LAYERS.strip().splitlines()) for name in line.split()}


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (a package by its ``__init__``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """(module imported, line) for each import of another asyncrl module in ``path``, wherever it stands."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from pkg import submodule` imports the submodule; `from module import name`, the module
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]
        else:
            continue
        for target in targets:
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in known and target != name and target != "asyncrl":
                found.append((target, node.lineno))
    return found


def graph(root: Path = PACKAGE) -> dict[str, list[tuple[str, int]]]:
    known = modules(root)
    return {name: imports(name, path, known) for name, path in known.items()}


def unit(module: str) -> str:
    """The top-level module or package a module belongs to: ``asyncrl.engine.local`` -> ``engine``."""
    return module.split(".")[1] if module.count(".") else ""


def upward(edges: dict[str, list[tuple[str, int]]], layers: dict[str, int]) -> list[str]:
    return [
        f"{a} (line {line}) imports {b}: layer {layers[unit(a)]} -> {layers[unit(b)]}"
        for a, targets in edges.items()
        for b, line in targets
        if unit(a) != unit(b) and layers[unit(a)] > layers[unit(b)]
    ]


def cycles(edges: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    succ = {a: sorted({b for b, _ in targets}) for a, targets in edges.items()}
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    for root in succ:
        if root in index:
            continue
        work = [(root, iter(succ[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(succ.get(w, []))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_every_unit_has_a_layer():
    missing = sorted({unit(m) for m in modules() if unit(m)} - set(layer_of()))
    assert not missing, f"give these a line in LAYERS: {missing}"


def test_imports_point_down_the_layers():
    found = upward(graph(), layer_of())
    assert not found, "upward imports:\n" + "\n".join(found)


def test_no_import_cycles():
    found = cycles(graph())
    assert not found, f"import cycles: {found}"


def test_no_cycles_between_top_level_units():
    """Packages and top-level modules do not import each other round a loop either (``data`` -> ``agent`` ->
    ``data`` is a cycle even when no two modules of them are)."""
    edges: dict[str, list[tuple[str, int]]] = {}
    for a, targets in graph().items():
        edges.setdefault(unit(a) or "asyncrl", []).extend((unit(b), line) for b, line in targets if unit(b) != unit(a))
    found = cycles(edges)
    assert not found, f"cycles between units: {found}"


def test_the_check_fails_on_a_planted_upward_import_and_cycle(tmp_path):
    """The checks above are live: an engine importing the launcher, and two modules importing each other."""
    package = tmp_path / "asyncrl"
    (package / "engine").mkdir(parents=True)
    (package / "launch").mkdir()
    (package / "__init__.py").write_text("")
    (package / "engine" / "__init__.py").write_text("")
    (package / "launch" / "__init__.py").write_text("")
    (package / "engine" / "local.py").write_text("def f():\n    from asyncrl.launch import train\n")
    (package / "launch" / "train.py").write_text("from asyncrl.engine.local import f\n")
    edges = graph(package)
    layers = layer_of()
    assert upward(edges, layers) == [
        f"asyncrl.engine.local (line 2) imports asyncrl.launch.train: layer {layers['engine']} -> {layers['launch']}"
    ]
    assert cycles(edges) == [["asyncrl.engine.local", "asyncrl.launch.train"]]


def test_the_loop_imports_nothing_of_the_launchers():
    found = [
        f"{a} imports {b}"
        for a, targets in graph().items()
        if unit(a) == "loop"
        for b, _ in targets
        if unit(b) in ("launch", "commands", "cli")
    ]
    assert not found, found


def test_no_module_is_over_500_lines():
    """A module past ~500 lines does two jobs: split it along them (DESIGN.md)."""
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > 500}
    assert not long, long
