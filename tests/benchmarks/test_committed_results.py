"""Every file committed under benchmarks/results/ is one the docs point to: by its path, through the README of
the run directory holding it, or as one of the report kinds docs/benchmarks.md describes (`<device>.json`,
`<device>.md`, `<device>-plots/*.png`, `kernels/kernel-report-triton-<version>.{md,json}`) with its source there."""

import re
import subprocess

from repo_paths import ROOT

RESULTS = "benchmarks/results"
DOCS = ("README.md", "docs/benchmarks.md", "docs/architecture.md")


def committed_results() -> list[str]:
    listed = subprocess.run(["git", "ls-files", RESULTS], cwd=ROOT, capture_output=True, text=True, check=True)
    return listed.stdout.split()


def unreferenced(paths: list[str], docs: str, readable) -> list[str]:
    """The paths nothing points to; `readable(path)` reads a committed file."""
    devices = {path.removeprefix(RESULTS + "/").removesuffix(".json") for path in paths
               if re.fullmatch(rf"{RESULTS}/[^/]+\.json", path)}
    missing = []
    for path in paths:
        relative = path.removeprefix(RESULTS + "/")
        folder, _, name = relative.rpartition("/")
        if path in docs or relative in docs:
            continue
        if folder and f"{RESULTS}/{folder}/README.md" in paths and (
                name == "README.md" and f"{RESULTS}/{folder}/" in docs
                or name in readable(f"{RESULTS}/{folder}/README.md")):
            continue
        stem = re.sub(r"(-plots/[^/]+\.png|\.md|\.json)$", "", relative)
        if stem in devices and "<device>" in docs:  # a run's report and plots, made from its <device>.json
            continue
        if re.fullmatch(r"kernels/kernel-report-triton-[0-9.]+\.(md|json)", relative) and \
                name.rsplit(".", 1)[0] in docs:
            continue
        missing.append(path)
    return missing


def test_every_committed_result_is_referenced_by_the_docs():
    docs = "\n".join((ROOT / name).read_text() for name in DOCS)
    assert unreferenced(committed_results(), docs, lambda path: (ROOT / path).read_text()) == []


def test_an_orphan_result_is_found():
    paths = [f"{RESULTS}/a100.json", f"{RESULTS}/a100.md", f"{RESULTS}/old-run/README.md",
             f"{RESULTS}/old-run/kept.log", f"{RESULTS}/old-run/orphan.log", f"{RESULTS}/stray.csv"]
    docs = f"see `<device>.md` and `{RESULTS}/old-run/`"
    assert unreferenced(paths, docs, lambda path: "kept.log") == [f"{RESULTS}/old-run/orphan.log",
                                                                  f"{RESULTS}/stray.csv"]
