"""Which token rows go through the LM head, and where they sit in the objective's [B, T] grid.

GRPO batches are mostly padding when completion lengths vary, so only positions with a nonzero
completion mask are sent through the head: their hidden rows are gathered before (autograd scatters
their gradients back) and their log-probs and entropies scattered into a [B, T] grid after, with 0 at
the padded positions. A packed batch (hidden [N, H] with sequence boundaries `cu_seqlens`, as verl's
remove-padding and TRL's padding-free collators produce) maps onto the same grid: sequence s is grid row s.
The objective only ever sees the grid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch


@dataclass
class TokenLayout:
    batch_shape: tuple[int, int]  # (B, T) of the objective's grid
    mask: torch.Tensor  # [B, T] float32: the completion mask on the grid
    source_rows: Optional[torch.Tensor]  # [R] rows of the flattened input that go through the head; None: all
    grid_rows: Optional[torch.Tensor]  # [R] their flat positions in the grid; None: the identity
    # rows_per_sequence's answer, kept: it costs a host synchronisation, and `auto` asks it twice a call (the
    # workspace of the sequence route, then its waves)
    _rows_per_sequence: Optional[tuple[int, ...]] = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def padded(cls, completion_mask: torch.Tensor, compact: bool = True) -> "TokenLayout":
        """[B, T] input. `compact` drops the masked rows (a data-dependent shape: off under torch.compile)."""
        mask = completion_mask.to(torch.float32)
        rows = torch.nonzero(mask.reshape(-1)).squeeze(-1) if compact else None
        if rows is not None and rows.numel() == mask.numel():
            rows = None  # every row scored: the head reads hidden in place (no [N, H] copy, no dH scatter)
        return cls(tuple(mask.shape), mask, rows, rows)

    @classmethod
    def packed(cls, cu_seqlens: torch.Tensor, completion_mask: Optional[torch.Tensor], n_tokens: int
               ) -> "TokenLayout":
        """[N] input of S sequences, sequence s being tokens cu_seqlens[s]:cu_seqlens[s + 1]."""
        device = cu_seqlens.device
        lengths = cu_seqlens[1:] - cu_seqlens[:-1]
        S, T = lengths.numel(), int(lengths.max()) if lengths.numel() else 0
        sequence = torch.repeat_interleave(torch.arange(S, device=device), lengths)
        offset = torch.arange(n_tokens, device=device) - cu_seqlens[:-1].repeat_interleave(lengths)
        grid = sequence * T + offset
        valid = torch.ones(n_tokens, dtype=torch.bool, device=device)
        if completion_mask is not None:
            valid = completion_mask.reshape(-1) != 0
        mask = torch.zeros(S * T, dtype=torch.float32, device=device)
        mask[grid[valid]] = 1.0
        source = torch.nonzero(valid).squeeze(-1)
        return cls((S, T), mask.view(S, T), source, grid[source])

    @property
    def num_rows(self) -> int:
        B, T = self.batch_shape
        return B * T if self.grid_rows is None else self.grid_rows.numel()

    def rows_per_sequence(self) -> tuple[int, ...]:
        """How many of the head's rows each grid row (sequence) holds, in order: the head's rows are grouped by
        sequence, the sequences in grid order (a host synchronisation, once per layout)."""
        if self._rows_per_sequence is None:
            B, T = self.batch_shape
            if self.grid_rows is None:
                self._rows_per_sequence = (T,) * B
            else:
                self._rows_per_sequence = tuple(torch.bincount(
                    torch.div(self.grid_rows, T, rounding_mode="floor"), minlength=B).tolist()) if T else (0,) * B
        return self._rows_per_sequence

    def head_rows(self, flat: torch.Tensor) -> torch.Tensor:
        """The rows of a flattened input ([N, ...] or [B*T, ...]) that go through the head."""
        return flat if self.source_rows is None else flat.index_select(0, self.source_rows)

    def per_row(self, grid: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """Per-row values of a [B, T] grid tensor (or [B, 1], broadcast along the sequence)."""
        if grid is None:
            return None
        flat = grid.expand(self.batch_shape).reshape(-1)
        return flat if self.grid_rows is None else flat.index_select(0, self.grid_rows)

    def to_grid(self, rows: torch.Tensor) -> torch.Tensor:
        """[R] per-row values -> [B, T], 0 elsewhere; differentiable."""
        if self.grid_rows is None:
            return rows.view(self.batch_shape) * self.mask.to(rows.dtype)
        B, T = self.batch_shape
        return rows.new_zeros(B * T).index_put((self.grid_rows,), rows).view(B, T)

    def packed_to_grid(self, packed: Optional[torch.Tensor], cu_seqlens: torch.Tensor,
                       fill: float = 0.0) -> Optional[torch.Tensor]:
        """A per-token [N] input of a packed batch (old/ref log-probs, importance ratio) on the grid, `fill` on the
        padding (1 for a ratio: vespo takes its log even where the mask is 0)."""
        if packed is None:
            return None
        lengths = cu_seqlens[1:] - cu_seqlens[:-1]
        B, T = self.batch_shape
        sequence = torch.repeat_interleave(torch.arange(B, device=packed.device), lengths)
        offset = torch.arange(packed.numel(), device=packed.device) - cu_seqlens[:-1].repeat_interleave(lengths)
        grid = packed.new_full((B * T,), fill)
        return grid.index_put((sequence * T + offset,), packed.reshape(-1)).view(B, T)

    def output_rows(self, rows: torch.Tensor, n_input_rows: int) -> torch.Tensor:
        """[R] per-row values back in the input's flat row order ([N] packed / [B*T] padded), 0 elsewhere."""
        if self.source_rows is None:
            return rows
        return rows.new_zeros(n_input_rows).index_put((self.source_rows,), rows)
