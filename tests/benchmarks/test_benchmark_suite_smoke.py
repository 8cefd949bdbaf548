"""The benchmark suite runs end to end on the smallest CPU shapes (one round per case), so it cannot rot: its JSON
holds every case our own paths define, each recording the values its case defines, and every case it leaves out
is a skip that names its path and reason."""

import json
import os
import re
import subprocess
import sys

import pytest

from benchmarks.suite.cases import LOSS_CASES, REGIMES, STANDARD_LOSS_CASES, flops
from benchmarks.suite.paths import OWN_BACKENDS
from benchmarks.suite.shapes import shape_set
from benchmarks.suite.test_variants import BACKENDS as VARIANT_BACKENDS
from benchmarks.suite.test_variants import CASES as VARIANT_CASES
from benchmarks.suite.test_vocab_parallel import BACKENDS as SHARDED_BACKENDS
from benchmarks.suite.test_vocab_parallel import CASES as SHARDED_CASES
from benchmarks.suite.test_vocab_parallel import SHARDINGS
from repo_paths import ROOT

(SHAPE,) = shape_set("smoke")
# One run of the whole benchmark suite in a process of its own: the slow tier.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """(the suite's pytest-benchmark JSON, its console output) after one run on the smoke shapes, without a GPU.
    Peak memory is left out: the fresh-process measurement has its own test (test_fused_memory_scaling.py)."""
    out = tmp_path_factory.mktemp("smoke") / "smoke.json"
    command = [sys.executable, "-m", "pytest", "benchmarks/suite/", "--bench-set=smoke", "--bench-rounds=1",
               "--bench-warmup=0", "--bench-no-memory", f"--benchmark-json={out}", "-q", "-rs",
               "-p", "no:cacheprovider"]
    # Not as an xdist worker, which this process may be: pytest-benchmark turns itself off in a process that has
    # PYTEST_XDIST_WORKER set.
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_XDIST_")}
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=dict(env, CUDA_VISIBLE_DEVICES=""))
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    return json.loads(out.read_text()), output


def _recorded(data: dict) -> set[tuple]:
    return {(b["extra_info"]["operation"], b["extra_info"]["config"], b["extra_info"]["regime"],
             b["extra_info"]["path"]) for b in data["benchmarks"] if "path" in b["extra_info"]}


def test_every_case_of_our_own_paths_runs(suite):
    data, _ = suite
    expected = {("loss", "-", "flat", "floor"), ("logprobs", "-", "flat", "floor")}
    for path in OWN_BACKENDS:
        for regime in REGIMES:
            expected |= {(operation, case, regime, path) for operation in ("loss", "logits")
                         for case in STANDARD_LOSS_CASES}
            expected.add(("logprobs", "dapo", regime, path))
    expected |= {("loss", case, "flat", path) for case in VARIANT_CASES for path in VARIANT_BACKENDS}
    missing = expected - _recorded(data)
    assert not missing, f"cases of our own paths the suite did not record: {sorted(missing)}"
    sharded = {(b["extra_info"]["config"], b["extra_info"]["backend"], b["extra_info"]["vocab_parallel"])
               for b in data["benchmarks"] if "vocab_parallel" in b["extra_info"]}
    assert sharded == {(c, b, s) for c in SHARDED_CASES for b in SHARDED_BACKENDS for s in SHARDINGS}


def test_each_case_records_the_shape_work_and_tokens_it_ran(suite):
    data, _ = suite
    own_mask = {}  # regime -> valid tokens of the inputs' own mask: every case without padding runs it
    entropy = {}
    for bench in data["benchmarks"]:
        info, name = bench["extra_info"], bench["fullname"]
        assert bench["stats"]["rounds"] == 1 and bench["stats"]["min"] > 0, name
        assert (info["head"], info["hidden"], info["vocab"], info["tokens"], info["dtype"], info["device"]) == (
            SHAPE.head.name, SHAPE.head.hidden, SHAPE.head.vocab, SHAPE.tokens, SHAPE.dtype, "cpu"), name
        if "path" not in info:  # the vocabulary-parallel rows record their sharding instead
            continue
        assert info["flops"] == flops(info["operation"], SHAPE.tokens, SHAPE.head.hidden, SHAPE.head.vocab), name
        fraction = LOSS_CASES[info["config"]].valid_fraction if info["config"] in LOSS_CASES else None
        if fraction is not None:  # right padding at the case's fraction of the B x T positions
            assert info["valid_tokens"] == round(fraction * SHAPE.tokens), name
        else:
            assert own_mask.setdefault(info["regime"], info["valid_tokens"]) == info["valid_tokens"], name
        assert entropy.setdefault(info["regime"], info["mean_entropy"]) == info["mean_entropy"], name
    assert set(own_mask) == set(REGIMES) and all(0 < v < SHAPE.tokens for v in own_mask.values()), own_mask
    assert entropy["peaked"] < entropy["flat"] / 2, entropy  # the regimes' inputs differ as their names say


def test_every_case_left_out_names_its_path_and_reason(suite):
    data, output = suite
    summary = [line for line in output.splitlines() if re.search(r"\d+ passed", line)][-1]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|skipped)", summary)}
    assert counts == {"passed": len(data["benchmarks"]), "skipped": len(data["skipped"])}, output[-2000:]
    for skip in data["skipped"]:
        reason, node = skip["reason"], skip["nodeid"]
        if node.startswith("benchmarks/suite/test_memory_wall.py::"):
            assert reason == "the memory wall is measured on a CUDA device only", skip
            continue
        path, _, why = reason.partition(": ")
        assert path not in OWN_BACKENDS and f"-{path}]" in node and len(why) >= 10, skip
