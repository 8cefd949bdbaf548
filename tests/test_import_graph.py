"""No import cycle among the modules of grpo_kernels/, grpo_engine/ and benchmarks/, counting imports inside functions
(tests/support/import_graph.py reads them from the source); and the cycle finder finds the cycles it must.
The layers import only downward, a backend's module is reached through its registry entry only, no module takes
another's private name, and no product module imports a pytest conftest."""

import ast
import importlib.util

import pytest
from import_graph import find_cycle, import_graph, module_names
from repo_paths import ROOT

from grpo_kernels.backends import BACKENDS

PACKAGES = ("grpo_kernels", "grpo_engine", "benchmarks")
# Bottom to top: a module may import its own layer and those below. The library's core (the registry, the
# backends, the kernels, the cost model, the math) under the autograd glue and routing (and the one-pass sequence
# route, which is both), under the public
# functions, under the Liger-compatible module, under the integrations, under the engine, under the benchmarks.
LAYERS = [("grpo_kernels",), ("grpo_kernels.ops", "grpo_kernels.routing", "grpo_kernels.sequence_route"),
          ("grpo_kernels.api",),
          ("grpo_kernels.module",), ("grpo_kernels.integrations",), ("grpo_engine",), ("benchmarks",)]


def layer(module: str) -> int:
    """The index in LAYERS of the longest prefix naming `module` (a package prefix covers its submodules)."""
    matches = [(len(prefix), index) for index, prefixes in enumerate(LAYERS) for prefix in prefixes
               if module == prefix or module.startswith(prefix + ".")]
    return max(matches)[1]


def upward_imports(graph) -> list[str]:
    return sorted(f"{module} -> {target}" for module, targets in graph.items() for target in targets
                  if layer(target) > layer(module))


def test_the_layers_import_only_downward():
    assert upward_imports(import_graph(ROOT, PACKAGES)) == []


def test_an_upward_import_is_found():
    graph = {"grpo_kernels.backends.vocab_parallel": {"grpo_kernels.ops"}, "grpo_kernels.api": {"grpo_kernels.ops"},
             "grpo_engine.trainer": {"grpo_kernels.api"}, "grpo_kernels.head": {"grpo_engine.trainer"}}
    assert upward_imports(graph) == ["grpo_kernels.backends.vocab_parallel -> grpo_kernels.ops",
                                     "grpo_kernels.head -> grpo_engine.trainer"]


def test_backend_modules_are_reached_through_the_registry_only():
    """Outside grpo_kernels/backends/, nothing imports a backend's module: what is shared (the workspace default,
    the one-pass callback) lives in a module every layer may read, and a backend is asked for by name."""
    backend_modules = {importlib.util.resolve_name(module, "grpo_kernels.backends")
                       for spec in BACKENDS.values() for module in (spec.module, spec.logits_module)}
    graph = import_graph(ROOT, PACKAGES)
    reaching = sorted(f"{module} -> {target}" for module, targets in graph.items()
                      if not module.startswith("grpo_kernels.backends") for target in targets & backend_modules)
    assert reaching == []


def _private_imports(names: dict) -> list[str]:
    found = []
    for module, path in names.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                found += [f"{module}: from {'.' * node.level}{node.module or ''} import {alias.name}"
                          for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def test_no_module_takes_another_modules_private_names():
    assert _private_imports(module_names(ROOT, PACKAGES)) == []


def test_no_product_module_imports_a_conftest():
    graph = import_graph(ROOT, PACKAGES)
    assert sorted(f"{module} -> {target}" for module, targets in graph.items() for target in targets
                  if target.rsplit(".", 1)[-1] == "conftest" or target.rsplit(".", 1)[-1].startswith("test_")) == []


def test_the_packages_import_graph_is_acyclic():
    graph = import_graph(ROOT, PACKAGES)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_graph_sees_every_module_and_lazy_imports():
    graph = import_graph(ROOT, PACKAGES)
    assert set(graph) == set(module_names(ROOT, PACKAGES))
    assert {"grpo_engine.trainer", "grpo_engine.state.checkpoint", "benchmarks.gpu.command", "grpo_kernels.api"} <= set(graph)
    # grpo_engine/cli.py imports the trainer inside `train` only (torch stays unimported for --help): still an edge
    assert "grpo_engine.trainer" in graph["grpo_engine.cli"]
    # `from .state import checkpoint as ckpt`: the submodule, not the package
    assert "grpo_engine.state.checkpoint" in graph["grpo_engine.trainer"] and "grpo_engine.state" not in graph["grpo_engine.trainer"]


@pytest.mark.parametrize("graph, cycle", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
    ({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}, None),  # a diamond is no cycle
    ({"a": {"a"}}, ["a", "a"]),
    ({"a": {"b"}, "b": {"a"}}, ["a", "b", "a"]),
    ({"a": {"b"}, "b": {"c"}, "c": {"d"}, "d": {"b"}}, ["b", "c", "d", "b"]),
    ({"x": set(), "a": {"x", "b"}, "b": {"x", "c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
])
def test_cycle_finder_on_small_graphs(graph, cycle):
    assert find_cycle(graph) == cycle


def test_a_lazy_import_cycle_is_found(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .b import B\n")
    (package / "b.py").write_text("B = 1\n\n\ndef late():\n    from . import a  # lazy: no cycle at import time\n")
    (package / "typed.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\n")
    (package / "c.py").write_text("import pkg.typed\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.a"}
    assert graph["pkg.typed"] == set() and graph["pkg.c"] == {"pkg.typed"}  # TYPE_CHECKING imports never run
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]
