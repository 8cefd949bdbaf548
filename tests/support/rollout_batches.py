"""A rollout batch of random token ids with some left padding and varied completion lengths, for the update step
tests and the multi-process workers that compare against them."""

import torch

from grpo_engine.rollout.base import RolloutBatch


def synthetic_batch(vocab: int, n: int = 8, prompt_len: int = 5, completion_len: int = 7,
                    seed: int = 0) -> RolloutBatch:
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, vocab, (n, prompt_len), generator=g)
    prompt_mask = torch.ones(n, prompt_len, dtype=torch.long)
    prompt_mask[::2, :2] = 0  # some left padding
    completion_ids = torch.randint(3, vocab, (n, completion_len), generator=g)
    lengths = torch.randint(1, completion_len + 1, (n,), generator=g)
    mask = (torch.arange(completion_len)[None, :] < lengths[:, None]).long()
    return RolloutBatch(["p"] * n, ["c"] * n, prompt_ids, prompt_mask, completion_ids, mask, mask.clone(),
                        torch.zeros(n, dtype=torch.bool))
