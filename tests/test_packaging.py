"""What `pip install` ships: the loss library and the engine, none of the benchmark suite (nothing installed
imports it; it runs from the checkout), and no pytest file."""

import tomllib

from import_graph import import_graph
from repo_paths import ROOT
from setuptools import find_namespace_packages, find_packages

SETTINGS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]


def shipped_packages() -> list[str]:
    return find_packages(where=str(ROOT), include=SETTINGS["include"], exclude=SETTINGS.get("exclude", ()))


def test_only_the_library_and_the_engine_are_installed():
    packages = shipped_packages()
    assert {"grpo_kernels", "grpo_kernels.backends", "grpo_engine", "grpo_engine.config"} <= set(packages)
    assert {package.split(".")[0] for package in packages} == {"grpo_kernels", "grpo_engine"}
    # every package directory under them is found (none lacks an __init__.py and would be left out)
    namespaces = find_namespace_packages(where=str(ROOT), include=SETTINGS["include"])
    assert sorted(p for p in namespaces if "__pycache__" not in p) == sorted(packages)


def test_no_pytest_file_is_shipped():
    for package in shipped_packages():
        folder = ROOT / package.replace(".", "/")
        files = [path.name for path in folder.glob("*.py")]
        assert not [name for name in files if name == "conftest.py" or name.startswith("test_")], package


def test_nothing_shipped_imports_the_benchmarks():
    graph = import_graph(ROOT, ("grpo_kernels", "grpo_engine", "benchmarks"))
    assert sorted(f"{module} -> {target}" for module, targets in graph.items()
                  if not module.startswith("benchmarks") for target in targets
                  if target.startswith("benchmarks")) == []
