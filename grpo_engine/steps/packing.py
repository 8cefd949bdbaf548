"""Padding-free micro-batches (`optim.padding_free`): whole sequences packed back to back up to a token budget.

A pack is one row of `input_ids` [1, L] holding S sequences (each its real prompt tokens then its completion up
to and including the first EOS), with `position_ids` restarting at 0 for each, and no attention mask. From those
position ids transformers confines attention to each sequence: flash_attention_2 runs varlen over the sequence
boundaries, sdpa and eager build a block-diagonal causal mask (masking_utils.find_packed_sequence_indices, in every
release since 5.0), which grpo_engine.model.packed_attention turns back into one sdpa call per sequence. The completion
rows of the pack go through the fused loss as its packed form (`cu_seqlens`).

With the default budget each batch takes the cheaper route, packed or padded (`plan_micro_batches`), by an
estimate of the work of each: tokens through the linear layers plus query-key pairs of attention, the pairs
weighted by their share of a token's work in this model (`attention_pair_cost`). Packs win where padding is
much of the batch; under a dense mask (eager) a pack's L^2 attention can cost more than the padding it saves.

Every process runs the same number of micro-batches (DDP's buffer broadcast and FSDP2's gathers run per forward):
a process with fewer packs splits its largest until the counts agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

import torch
import torch.distributed as dist
from torch import nn

from ..model.finite_forward import SCORED_HIDDEN, require_finite
from ..model.packed_attention import PER_SEQUENCE_SDPA
from ..rollout import RolloutBatch


# Without a budget, where attention runs over a dense [L, L] mask (eager, plain sdpa), a pack holds this many times
# the batch's longest sequence, its cost growing with the square of the pack (grpo_engine/tools/packing_bench.py), but at
# least DENSE_MASK_MIN_TOKENS: below about a thousand tokens the mask's L^2 is small next to the linear layers
# (packing_bench at hidden 384: packs of 576-1144 tokens were the fastest), while packs of two short sequences
# would make dozens of tiny micro-batches (the built-in demo: 128 sequences of ~25 tokens, 64 forwards and
# backwards instead of 1 padded one, 5x its CPU time).
DENSE_MASK_SEQUENCES = 2
DENSE_MASK_MIN_TOKENS = 1024


@dataclass(frozen=True)
class Packing:
    """How a padding-free step groups a process's sequences: at most `max_tokens` per pack. None: the batch's
    longest sequence times micro_batch_size under varlen attention (flash_attention_2, or sdpa per sequence: a
    pack costs what its sequences cost, and holds no more tokens than a padded micro-batch), else times
    min(micro_batch_size, DENSE_MASK_SEQUENCES), raised to DENSE_MASK_MIN_TOKENS where a padded micro-batch holds
    that many; and each batch packed or padded, whichever `pair_cost` estimates cheaper. An explicit budget
    always packs."""

    max_tokens: Optional[int] = None
    varlen_attention: bool = False
    pair_cost: float = 0.0  # attention_pair_cost of the model: one query-key pair's work over one token's


@dataclass
class Pack:
    """S sequences of a batch, packed: the model's inputs and the packed completion rows for the loss."""

    rows: torch.Tensor  # [S] the sequences' rows in the batch
    input_ids: torch.Tensor  # [1, L]
    position_ids: torch.Tensor  # [1, L], from 0 in each sequence
    hidden_index: torch.Tensor  # [N] the pack positions whose hidden states predict the completion tokens
    grid_index: tuple[torch.Tensor, torch.Tensor]  # ([N] row, [N] column) of each completion token in [n, T]
    cu_seqlens: torch.Tensor  # [S + 1] int32 completion offsets in the N rows
    completion_ids: torch.Tensor  # [N]
    completion_mask: torch.Tensor  # [N] the loss mask
    kept_token_ids: Optional[torch.Tensor]  # [N, K]

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[1]

    def rows_of(self, grid: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """The pack's completion tokens [N] of a per-token [n, T] tensor of the whole batch (old / ref log-probs)."""
        return None if grid is None else grid[self.grid_index]

    def scatter(self, values: torch.Tensor, grid: torch.Tensor) -> None:
        """Writes the pack's per-token values [N] into their places of an [n, T] tensor of the whole batch."""
        grid[self.grid_index] = values.to(grid.dtype)


def has_varlen_attention(model: nn.Module) -> bool:
    """Whether the model's attention runs each packed sequence alone (flash attention's varlen, or sdpa per
    sequence), not the pack under a dense mask."""
    implementation = str(getattr(model.config, "_attn_implementation", ""))
    return implementation.startswith("flash") or implementation == PER_SEQUENCE_SDPA


def attention_pair_cost(model_config: Any) -> float:
    """The work of one query-key pair of attention (its score and its share of the weighted sum: 2 x heads x
    head_dim multiply-adds in each layer) over the work of one token through a layer's linear layers (its
    weights' multiply-adds), from the model's config (a multimodal model's text config)."""
    config = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    hidden, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    mlp = getattr(config, "intermediate_size", None) or 4 * hidden
    linear = hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * mlp
    return 2 * heads * head_dim / linear


def sequence_lengths(batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt tokens, completion tokens) [n] of each sequence: what a pack holds of it."""
    return batch.prompt_mask.sum(dim=1), batch.completion_attention.sum(dim=1)


def token_budget(lengths: list[int], packing: Packing, micro_batch_size: int) -> int:
    """The pack size for sequences of these lengths (prompt + completion tokens)."""
    longest = max(lengths)
    if packing.max_tokens is None:
        padded_micro_batch = micro_batch_size * longest
        if packing.varlen_attention:
            return padded_micro_batch
        return min(padded_micro_batch, max(DENSE_MASK_SEQUENCES * longest, DENSE_MASK_MIN_TOKENS))
    if longest > packing.max_tokens:
        raise ValueError(f"optim.max_tokens_per_micro_batch ({packing.max_tokens}) is smaller than one sequence of "
                         f"this batch ({longest} prompt + completion tokens): raise it, or set optim.padding_free "
                         f"false")
    return packing.max_tokens


def plan_packs(lengths: list[int], budget: int) -> list[list[int]]:
    """Sequence indices grouped into packs of at most `budget` tokens: first fit, longest sequences first (few,
    well-filled packs); each pack's indices ascending, packs ordered by their first index."""
    packs: list[list[int]] = []
    room: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        target = next((p for p, free in enumerate(room) if free >= lengths[index]), None)
        if target is None:
            packs.append([])
            room.append(budget)
            target = len(packs) - 1
        packs[target].append(index)
        room[target] -= lengths[index]
    return sorted((sorted(pack) for pack in packs), key=lambda pack: pack[0])


def split_to_count(packs: list[list[int]], lengths: list[int], count: int) -> list[list[int]]:
    """Splits the largest packs (of 2 or more sequences) in two until there are `count` packs."""
    packs = [list(pack) for pack in packs]
    while len(packs) < count:
        splittable = [p for p in range(len(packs)) if len(packs[p]) > 1]
        if not splittable:
            raise ValueError(f"cannot make {count} micro-batches of {sum(map(len, packs))} sequences")
        largest = max(splittable, key=lambda p: sum(lengths[i] for i in packs[p]))
        pack = packs.pop(largest)
        packs[largest:largest] = [pack[:len(pack) // 2], pack[len(pack) // 2:]]
    return packs


def count_over_processes(count: int, device: torch.device) -> int:
    """The largest number of micro-batches of any process (this one's alone without a process group)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return count
    value = torch.tensor([count], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value.item())


def sum_over_processes(values: list[float], device: torch.device) -> list[float]:
    """The values summed over every process (this one's alone without a process group)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    total = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return total.tolist()


def padded_cost(batch: RolloutBatch, micro_batch_size: int, pair_cost: float) -> float:
    """The estimated work of the padded micro-batches: every row as wide as the batch, and attention over the
    whole [W, W] square where a micro-batch has padding (a masked sdpa), the causal half where it has none
    (transformers then drops the mask for sdpa's causal kernel)."""
    width = batch.prompt_ids.shape[1] + batch.completion_ids.shape[1]
    real = batch.attention_mask.bool()
    cost = 0.0
    for start in range(0, real.shape[0], micro_batch_size):
        rows = real[start:start + micro_batch_size]
        pairs = rows.shape[0] * width ** 2 / (1 if bool((~rows).any()) else 2)
        cost += rows.shape[0] * width + pair_cost * pairs
    return cost


def packed_cost(groups: list[list[int]], lengths: list[int], packing: Packing) -> float:
    """The estimated work of the packs: their tokens, and attention over each sequence's causal half (varlen) or
    over each pack's whole square (a dense mask)."""
    cost = 0.0
    for group in groups:
        tokens = sum(lengths[i] for i in group)
        pairs = sum(lengths[i] ** 2 / 2 for i in group) if packing.varlen_attention else tokens ** 2
        cost += tokens + packing.pair_cost * pairs
    return cost


MicroBatch = Union[slice, "Pack"]  # padded rows of the batch, or a pack of whole sequences


def padded_micro_batches(batch: RolloutBatch, micro_batch_size: int) -> list[slice]:
    return [slice(start, start + micro_batch_size) for start in range(0, len(batch.prompts), micro_batch_size)]


def plan_micro_batches(batch: RolloutBatch, packing: Optional[Packing], micro_batch_size: int) -> list[MicroBatch]:
    """The batch's micro-batches: padded without `packing`; with it, packs, or padded micro-batches where the
    default budget's packs are estimated to cost more (the same route on every process, by the costs summed
    over them)."""
    if packing is None:
        return padded_micro_batches(batch, micro_batch_size)
    lengths = packed_lengths(batch)
    groups = plan_packs(lengths, token_budget(lengths, packing, micro_batch_size))
    if packing.max_tokens is None:
        padded, packed = sum_over_processes([padded_cost(batch, micro_batch_size, packing.pair_cost),
                                             packed_cost(groups, lengths, packing)], batch.prompt_ids.device)
        if padded <= packed:
            return padded_micro_batches(batch, micro_batch_size)
    return build_packs(batch, groups, lengths)


def packed_lengths(batch: RolloutBatch) -> list[int]:
    """Each sequence's prompt + completion tokens: what a pack holds of it."""
    prompt, completion = sequence_lengths(batch)
    if bool((prompt == 0).any()):
        raise ValueError("a prompt has no tokens: its first completion token has no position to be predicted from")
    return (prompt + completion).tolist()


def make_packs(batch: RolloutBatch, packing: Packing, micro_batch_size: int) -> list[Pack]:
    """The batch's sequences as packs, as many on every process."""
    lengths = packed_lengths(batch)
    return build_packs(batch, plan_packs(lengths, token_budget(lengths, packing, micro_batch_size)), lengths)


def build_packs(batch: RolloutBatch, groups: list[list[int]], lengths: list[int]) -> list[Pack]:
    """The groups' packs, their largest split until every process has as many."""
    groups = split_to_count(groups, lengths, count_over_processes(len(groups), batch.prompt_ids.device))
    return [build_pack(batch, rows) for rows in groups]


def build_pack(batch: RolloutBatch, rows: list[int]) -> Pack:
    device = batch.prompt_ids.device
    index = torch.tensor(rows, device=device, dtype=torch.long)
    prompt_ids, prompt_mask = batch.prompt_ids[index], batch.prompt_mask[index].bool()
    completion_ids, attention = batch.completion_ids[index], batch.completion_attention[index].bool()
    prompt_lengths, completion_lengths = prompt_mask.sum(1), attention.sum(1)
    # Left-padded prompts and right-padded completions: each sequence's real tokens, in order, are the
    # prompt's set positions then the completion's.
    tokens = torch.cat([prompt_ids, completion_ids], dim=1)[torch.cat([prompt_mask, attention], dim=1)]
    lengths = prompt_lengths + completion_lengths
    starts = torch.cumsum(lengths, 0) - lengths
    position_ids = torch.arange(int(lengths.sum()), device=device) - torch.repeat_interleave(starts, lengths)
    # Completion token j of sequence s is predicted at its pack position start_s + P_s + j - 1.
    sequence = torch.repeat_interleave(torch.arange(len(rows), device=device), completion_lengths)
    column = torch.arange(int(completion_lengths.sum()), device=device) - torch.repeat_interleave(
        torch.cumsum(completion_lengths, 0) - completion_lengths, completion_lengths)
    hidden_index = (starts + prompt_lengths - 1)[sequence] + column
    grid_index = (index[sequence], column)
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(completion_lengths, 0), (1, 0)).to(torch.int32)
    kept = None if batch.kept_token_ids is None else batch.kept_token_ids[grid_index]
    return Pack(index, tokens[None, :], position_ids[None, :], hidden_index, grid_index, cu_seqlens,
                batch.completion_ids[grid_index], batch.completion_mask[grid_index], kept)


def pack_hidden_states(policy: nn.Module, pack: Pack) -> torch.Tensor:
    """[N, H] hidden states that predict the pack's completion tokens (differentiable if grads are on)."""
    hidden = policy(pack.input_ids, None, pack.position_ids)
    return require_finite(hidden[0, pack.hidden_index], SCORED_HIDDEN)


class PackedAttentionError(RuntimeError):
    pass


@torch.no_grad()
def check_packed_attention(policy: nn.Module, vocab_size: int, device: torch.device) -> None:
    """Refuses a model whose attention reaches across packed sequences (one that builds its own mask and ignores
    the restarting position ids): two sequences packed must give the second the hidden states it has alone.
    Run on every process (a sharded model's forward needs them all)."""
    ids = torch.randint(0, vocab_size, (7,), generator=torch.Generator().manual_seed(0)).to(device)
    positions = torch.tensor([0, 1, 2, 0, 1, 2, 3], device=device)
    was_training = policy.training
    policy.eval()  # no dropout: the two forwards must be comparable
    try:
        packed = policy(ids[None], None, positions[None])[0, 3:].float()
        alone = policy(ids[None, 3:], None, positions[None, 3:])[0].float()
    finally:
        policy.train(was_training)
    if (packed - alone).abs().max() > 0.05 * alone.abs().max() + 1e-4:  # half-precision differences are far smaller
        raise PackedAttentionError(
            "optim.padding_free: this model's attention mixes packed sequences (it does not confine attention by "
            "the position ids, as transformers' own models do); set optim.padding_free false")
