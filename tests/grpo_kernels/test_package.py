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


# The engine's dependencies and the optional ones: None in sys.modules makes `import x` fail as if x were not
# installed (ModuleNotFoundError), and importlib.util.find_spec(x) return None.
ABSENT = ("transformers", "accelerate", "yaml", "matplotlib", "peft", "pyarrow", "tqdm", "safetensors", "trl",
          "datasets")
WITHOUT_ENGINE_PROBE = """
import sys
for name in %r:
    sys.modules[name] = None
import torch
import grpo_kernels
from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss, reference
from grpo_kernels.integrations import lm_head, sharding  # the torch-only integration modules
g = torch.Generator().manual_seed(0)
hidden = torch.randn(2, 5, 8, generator=g, dtype=torch.float64, requires_grad=True)
weight = torch.randn(11, 8, generator=g, dtype=torch.float64)
ids = torch.randint(0, 11, (2, 5), generator=g)
mask = torch.ones(2, 5)
advantages = torch.tensor([0.5, -1.0], dtype=torch.float64)
config = GRPOLossConfig(loss_type="dapo")
expected = reference.fused_linear_grpo_loss(hidden, weight, ids, mask, advantages, config=config)
expected_grad, = torch.autograd.grad(expected.loss, hidden)
for backend in ("torch", "triton"):  # float32: what the Triton kernels take (run by the interpreter here)
    h = hidden.detach().float().requires_grad_()
    out = fused_linear_grpo_loss(h, weight.float(), ids, mask, advantages.float(), config=config, backend=backend)
    grad, = torch.autograd.grad(out.loss, h)
    torch.testing.assert_close(out.loss.double(), expected.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad.double(), expected_grad, rtol=1e-4, atol=1e-6)
try:
    grpo_kernels.integrations.patch_causal_lm
except ModuleNotFoundError as exc:
    assert exc.name.split(".")[0] == "transformers", exc
else:
    raise AssertionError("the transformers integration loaded without transformers")
assert all(sys.modules[name] is None for name in %r)
print("ok")
""" % (ABSENT, ABSENT)


def test_the_loss_library_needs_none_of_the_engine_dependencies():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", WITHOUT_ENGINE_PROBE], capture_output=True, text=True,
                            timeout=300, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
