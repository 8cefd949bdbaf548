"""The import graph of the repository's packages, read from their source with `ast`: every `import` and
`from ... import` counts, at module level or inside a function (a lazy import that dodges a cycle at import
time is still a cycle in the design). Two things are not edges: imports under `if TYPE_CHECKING:` (never
run) and the parent packages Python imports before a submodule (`from . import sub` in pkg/a.py needs pkg.sub,
not pkg's own names)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional

Graph = dict[str, set[str]]


def module_names(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under root/<package> (a package is its __init__)."""
    names = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names[".".join(parts)] = path
    return names


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The absolute names one import statement asks for (module names and `module.attribute` candidates)."""
    if isinstance(node, ast.Import):
        return [""] + [alias.name for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [target] + [f"{target}.{alias.name}" for alias in node.names]


def _import_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every import statement of a module, at any depth, except those under `if TYPE_CHECKING:`."""
    found = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _is_type_checking(test: ast.AST) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph(root: Path, packages: tuple[str, ...]) -> Graph:
    """module -> the modules of `packages` it imports anywhere in its source."""
    names = module_names(root, packages)
    graph: Graph = {}
    for module, path in names.items():
        is_package = path.name == "__init__.py"
        edges = set()
        for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
            target, *candidates = _imported(node, module, is_package)
            submodules = [name for name in candidates if name in names]
            if isinstance(node, ast.Import):
                submodules = [name for name in [target, *candidates] if name in names]
            elif len(submodules) < len(node.names) and target in names:
                submodules.append(target)  # `from target import attribute` runs target
            edges.update(name for name in submodules if name != module)
        graph[module] = edges
    return graph


def find_cycle(graph: Graph) -> Optional[list[str]]:
    """One cycle as [a, b, ..., a], or None when the graph is acyclic (depth-first search, iterative)."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = {node: WHITE for node in graph}
    for start in sorted(graph):
        if colour[start] != WHITE:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        colour[start] = GREY
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                colour[node] = BLACK
            elif colour.get(child, BLACK) == GREY:
                return path[path.index(child):] + [child]
            elif colour.get(child) == WHITE:
                colour[child] = GREY
                path.append(child)
                stack.append((child, iter(sorted(graph.get(child, ())))))
    return None
