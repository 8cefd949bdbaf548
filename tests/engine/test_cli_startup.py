"""`grpo-engine` answers help, argument errors and config errors without importing torch or transformers."""

import json
import os
import subprocess
import sys
import time

import pytest

from repo_paths import ROOT

HEAVY = ("torch", "transformers", "accelerate", "triton", "numpy")

# Runs the CLI in a fresh interpreter, then reports its exit code and which heavy modules it imported.
PROBE = """
import json, sys
from grpo_engine.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "imported": [m for m in %r if m in sys.modules]}), file=sys.stderr)
""" % (HEAVY,)


def _seconds(args: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return time.perf_counter() - start, result


@pytest.fixture(scope="module")
def heavy_import_seconds() -> float:
    """What a fresh interpreter takes to import torch and transformers here, now (the machine's load included)."""
    elapsed, result = _seconds(["-c", "import torch, transformers"])
    assert result.returncode == 0, result.stderr[-2000:]
    return elapsed


@pytest.mark.parametrize("args, code", [
    (["--help"], 0),
    (["train", "--help"], 0),
    (["eval", "--help"], 0),
    (["plot", "--help"], 0),
    (["bench", "--help"], 0),
    (["train", "--optim.learning_rat", "1e-5"], 2),  # argparse: an unknown flag
    (["bench", "--scale", "huge"], 2),
    (["train", "--loss.loss_type", "ppo"], 2),  # the config's own validation
    (["train", "--config", "examples/demo.yaml", "--model", "/no/such/model"], 2),
])
def test_help_and_argument_errors_import_no_torch(args, code, heavy_import_seconds):
    elapsed, result = _seconds(["-c", PROBE, *args])
    report = json.loads(result.stderr.strip().splitlines()[-1])
    assert report == {"code": code, "imported": []}, result.stderr[-2000:]
    # The answer comes sooner than importing torch and transformers alone would, measured beside it under the same
    # load (a fixed bound in seconds failed on a CI machine whose two cores ran two test workers and more).
    assert elapsed < 0.5 * heavy_import_seconds, f"{args}: {elapsed:.2f} s, importing torch {heavy_import_seconds:.2f} s"


# As on a machine with the loss library alone (`pip install grpo-kernels`): None in sys.modules makes the engine
# extra's modules uninstalled for this process.
WITHOUT_EXTRA_PROBE = """
import sys
for name in ("yaml", "transformers", "accelerate", "matplotlib"):
    sys.modules[name] = None
from grpo_engine.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("args", [["train"], ["--help"], ["eval", "--model", "m"]])
def test_without_the_engine_extra_one_line_says_how_to_install_it(args):
    result = subprocess.run([sys.executable, "-c", WITHOUT_EXTRA_PROBE, *args], capture_output=True, text=True,
                            timeout=60, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert result.returncode == 1 and result.stdout == "", result.stderr[-2000:]
    assert result.stderr == ("grpo-engine needs the engine extra; missing: pyyaml, transformers, accelerate. Install "
                             'it: pip install "grpo-kernels[engine]" (in a checkout: pip install -e ".[engine]")\n')
