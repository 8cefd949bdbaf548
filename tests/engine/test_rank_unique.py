"""Processes started by hand that give two of them the same RANK: before, both joined, rank 0 and one of them
trained as a whole run (exit 0) and the other failed with gloo's raw text. Now the second to join as a rank stops in
one line naming RANK, and the first ones go on."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from grpo_engine.config import ConfigError
from grpo_engine.process_group import check_rank_unique


@settings(max_examples=60, deadline=None)
@given(ranks=st.lists(st.integers(0, 7), min_size=1, max_size=12), restart=st.sampled_from([None, "0", "3"]))
def test_the_second_process_to_join_as_a_rank_is_refused_naming_it(ranks, restart):
    store = torch.distributed.HashStore()  # the group's store: one for the whole launch
    joined: set[int] = set()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.distributed.distributed_c10d, "_get_default_store", lambda: store)
        patch.setattr(torch.distributed, "is_initialized", lambda: True)
        patch.setenv("WORLD_SIZE", "8")
        if restart is None:
            patch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
        else:
            patch.setenv("TORCHELASTIC_RESTART_COUNT", restart)
        for rank in ranks:
            patch.setattr(torch.distributed, "get_rank", lambda rank=rank: rank)
            if rank in joined:
                with pytest.raises(ConfigError) as refused:
                    check_rank_unique()
                message = str(refused.value)
                assert "\n" not in message and message.startswith(f"environment variable RANK={rank}: ")
                assert f"joined as rank {rank} already" in message
            else:
                check_rank_unique()
                joined.add(rank)


def test_a_torchrun_restart_joins_the_same_store_as_a_new_attempt(monkeypatch):
    """torchrun --max-restarts starts every rank again on the agent's store, which keeps its keys."""
    store = torch.distributed.HashStore()
    monkeypatch.setattr(torch.distributed.distributed_c10d, "_get_default_store", lambda: store)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    for attempt in ("0", "1", "2"):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", attempt)
        check_rank_unique()
