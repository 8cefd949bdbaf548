"""`import grpo_kernels`: the config costs no torch import; the first torch-backed name picks the interpreter."""

import os
import subprocess
import sys

from repo_paths import ROOT

PROBE = """
import os, sys
from grpo_kernels import GRPOLossConfig
GRPOLossConfig(beta=0.04)
assert "torch" not in sys.modules, "the config imported torch"
from grpo_kernels import fused_linear_grpo_loss, reference
import torch
expected = None if torch.cuda.is_available() else "1"
assert os.environ.get("TRITON_INTERPRET") == expected, os.environ.get("TRITON_INTERPRET")
import grpo_kernels
assert set(grpo_kernels.__all__) <= set(dir(grpo_kernels)) and callable(grpo_kernels.linear_logprobs)
print("ok")
"""


def test_the_config_is_torch_free_and_functions_load_on_first_use():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, cwd=ROOT,
                            env={**env, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
