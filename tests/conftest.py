import pytest
import torch

# grpo_kernels picks the Triton interpreter on a machine without CUDA when its functions are first imported;
# choosing it here, before any test module imports triton, makes that choice hold for the whole session.
from grpo_kernels.kernels.launch import use_interpreter_if_no_gpu

use_interpreter_if_no_gpu()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
