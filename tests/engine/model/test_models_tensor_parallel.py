"""A model loaded with transformers' tensor-parallel plan (2 gloo processes on CPU): grpo_engine.model.loading.with_lm_head
hands its vocabulary-sharded LM head to the fused loss as it is, and the loss, log-probs and each rank's
LM-head gradient shard equal the whole model's (tests/support/tp_worker.py)."""

import os
import subprocess
import sys

import pytest

from repo_paths import ROOT, SUPPORT


@pytest.mark.slow
def test_tensor_parallel_head_matches_whole_model(tensor_parallel_model_dir, tmp_path):
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{SUPPORT}", OMP_NUM_THREADS="1")
    init_file = tmp_path / "init"
    worker = str(SUPPORT / "tp_worker.py")
    ranks = [subprocess.Popen([sys.executable, worker, str(tensor_parallel_model_dir), str(init_file), str(rank), "2"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(2)]
    outputs = [rank.communicate(timeout=240)[0] for rank in ranks]
    for rank, output in zip(ranks, outputs):
        assert rank.returncode == 0, output[-4000:]
