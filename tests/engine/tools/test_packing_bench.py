"""The packing benchmark's inputs are what its report states: each spread's lengths and fill."""

import pytest
import torch

from grpo_engine.tools import packing_bench

# spread: (min, max, mean completion tokens, fill of the padded micro-batches)
STATED = {"uniform-128": (128, 128, 128, 0.917), "96-128": (96, 128, 112, 0.833), "32-256": (32, 256, 144, 0.600),
          "long-tail": (12, 512, 148, 0.340), "long-tail-short": (8, 431, 80, 0.258)}


@pytest.mark.parametrize("spread", list(packing_bench.SPREADS))
def test_each_spread_has_the_stated_lengths_and_fill(spread):
    batch = packing_bench.rollouts(spread, seed=0)
    lengths = batch.completion_attention.sum(1)
    assert sorted(lengths.tolist()) == sorted(packing_bench.SPREADS[spread][1](packing_bench.N).tolist())
    low, high, mean, fill = STATED[spread]
    assert (int(lengths.min()), int(lengths.max()), round(float(lengths.float().mean()))) == (low, high, mean)
    assert packing_bench.fill(batch) == pytest.approx(fill, abs=5e-4)
    prompts = batch.prompt_mask.sum(1)
    assert int(prompts.min()) == 32 and int(prompts.max()) == 64
    # left-padded prompts, right-padded completions: each row's real tokens are contiguous
    assert torch.equal(batch.prompt_mask, batch.prompt_mask.cummax(1).values)
    assert torch.equal(batch.completion_attention, batch.completion_attention.flip(1).cummax(1).values.flip(1))


def test_the_long_tail_is_the_log_normal_s_quantiles():
    lengths = packing_bench.log_normal_quantiles(32, 100, 1.0, 512)
    assert lengths.tolist() == sorted(lengths.tolist()) and int(lengths[16]) == pytest.approx(100, abs=5)
    assert (lengths == 512).sum() == 2  # two reach the cap


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--spreads", "uniform"], ["--spreads"]])
def test_bad_arguments_stop_before_any_measurement(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        packing_bench.main(argv)
    lines = capsys.readouterr().err.splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1 and ("argument --" in lines[0] or "must be" in lines[0])
