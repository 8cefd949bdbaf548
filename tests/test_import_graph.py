"""No import cycle among the modules of grpo_kernels/, engine/ and benchmarks/, counting imports inside functions
(tests/support/import_graph.py reads them from the source); and the cycle finder finds the cycles it must."""

import pytest
from import_graph import find_cycle, import_graph, module_names
from repo_paths import ROOT

PACKAGES = ("grpo_kernels", "engine", "benchmarks")


def test_the_packages_import_graph_is_acyclic():
    graph = import_graph(ROOT, PACKAGES)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_graph_sees_every_module_and_lazy_imports():
    graph = import_graph(ROOT, PACKAGES)
    assert set(graph) == set(module_names(ROOT, PACKAGES))
    assert {"engine.trainer", "engine.state.checkpoint", "benchmarks.gpu.command", "grpo_kernels.api"} <= set(graph)
    # engine/cli.py imports the trainer inside `train` only (torch stays unimported for --help): still an edge
    assert "engine.trainer" in graph["engine.cli"]
    # `from .state import checkpoint as ckpt`: the submodule, not the package
    assert "engine.state.checkpoint" in graph["engine.trainer"] and "engine.state" not in graph["engine.trainer"]


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
