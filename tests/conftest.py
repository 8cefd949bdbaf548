import importlib.util
import os

import pytest
import torch

# grpo_kernels picks the Triton interpreter on a machine without CUDA when its functions are first imported;
# choosing it here, before any test module imports triton, makes that choice hold for the whole session.
from grpo_kernels.kernels.launch import use_interpreter_if_no_gpu

use_interpreter_if_no_gpu()

# Under pytest-xdist (the root conftest.py: one worker per CPU) each worker takes its share of the CPUs for torch's
# intra-op threads, so that the workers together start no more threads than there are cores: torch's default (one
# per core in every worker) makes them wait on each other's OpenMP barriers.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

# The engine's messages shown as `grpo-engine` shows them (grpo_engine/messages.py), for the tests that call the
# engine's functions directly and read what a person would see.
from grpo_engine.messages import show_messages  # noqa: E402

show_messages()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks added here
def pytest_collection_modifyitems(config, items):
    """`gpu` tests skip without CUDA, `vllm` tests without vLLM; `interpreter` tests (Triton on CPU tensors) skip
    with CUDA, unless the interpreter was asked for (TRITON_INTERPRET=1).

    The tests of a module that share a module-scoped fixture (a compile, a training run, a server) form one
    `xdist_group`: pytest-xdist (`--dist loadgroup`, pyproject's addopts) runs them in one worker, so the fixture is
    made once, not once in each worker that happens to get one of them."""
    from grpo_kernels.kernels.launch import interpreting

    cuda = torch.cuda.is_available()
    vllm = importlib.util.find_spec("vllm") is not None
    for item in items:
        if _uses_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
        if item.get_closest_marker("vllm") and not vllm:
            item.add_marker(SKIP_VLLM)
        if "gpu" in item.keywords and not cuda:
            item.add_marker(SKIP_GPU)
        if "interpreter" in item.keywords and cuda and not interpreting():
            item.add_marker(SKIP_INTERPRETER)


def _uses_a_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(definitions[-1].scope == "module"
                                    for definitions in info.name2fixturedefs.values() if definitions)


SKIP_GPU = pytest.mark.skip(reason="needs a CUDA GPU")
SKIP_VLLM = pytest.mark.skip(reason="needs vLLM, not installed here: .ci/vllm_tests runs these tests in an environment "
                                    "with vLLM's CPU build")
SKIP_INTERPRETER = pytest.mark.skip(
    reason="runs Triton kernels on CPU tensors, which needs the Triton interpreter, and grpo_kernels turns it on "
           "only on a machine without CUDA (set TRITON_INTERPRET=1 to run it here); tests/grpo_kernels/test_gpu.py runs "
           "the "
           "compiled kernels")


@pytest.fixture()
def cpu_only_subprocesses(monkeypatch):
    """The processes a test starts see no GPU: on a machine with CUDA they run as on a CPU machine (gloo on CPU
    tensors, Triton under the interpreter that grpo_kernels then turns on), as the test expects."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
