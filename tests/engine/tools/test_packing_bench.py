"""The packing benchmark's inputs are what its report states: long-tailed lengths, a third real tokens."""

import pytest
import torch

from engine.tools import packing_bench


def test_the_batch_has_the_stated_lengths_and_fill():
    batch = packing_bench.rollouts(seed=0)
    lengths = batch.completion_attention.sum(1)
    assert sorted(lengths.tolist()) == packing_bench.completion_lengths(packing_bench.N).tolist()  # quantiles
    assert (int(lengths.min()), int(lengths.max()), round(float(lengths.float().mean()))) == (12, 512, 148)
    assert packing_bench.fill(batch) == pytest.approx(0.340, abs=5e-4)
    prompts = batch.prompt_mask.sum(1)
    assert int(prompts.min()) == 32 and int(prompts.max()) == 64
    # left-padded prompts, right-padded completions: each row's real tokens are contiguous
    assert torch.equal(batch.prompt_mask, batch.prompt_mask.cummax(1).values)
    assert torch.equal(batch.completion_attention, batch.completion_attention.flip(1).cummax(1).values.flip(1))


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--steps", "0"], ["--budgets", "0"]])
def test_bad_arguments_stop_before_any_measurement(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        packing_bench.main(argv)
    assert exit_info.value.code == 2
    assert "must be >= 1" in capsys.readouterr().err
