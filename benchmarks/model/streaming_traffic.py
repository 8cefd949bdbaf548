"""Modelled HBM traffic of the fused streaming Triton kernels, against the GEMMs they replace.

    python -m benchmarks.model.streaming_traffic            # S1: N=8192, H=4096, V=151936, bf16, H100 tables

The model, per kernel (element size s bytes, `waves` = programs / SMs rounded up):
- a tensor every program of a wave streams in the same order (W in the forward and dH, hidden in dW)
  comes from HBM once per wave: the rest of the wave hits L2;
- a program's private re-reads (its hidden block once per vocabulary tile in the forward and dH, its
  W slice once per token tile in dW) come from HBM: a wave's private blocks together exceed the 50 MB
  L2 at the shapes that matter (e.g. all of hidden, 64 MiB at S1);
- a float32 accumulator that does not fit on chip (dH: [tokens, H]; dW: [vocab, H]) is read and
  written once per dz tile it absorbs; the final float32 -> 16-bit cast reads 4 and writes s bytes.
The GEMMs replaced (logits materialized in 16 bits): forward Z = H W^T reads N H s + V H s and
writes N V s; backward the same recompute, dH = dZ W and dW = dZ^T H, each reading its two operands
and writing its result once.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Tiles:
    block_n: int
    block_v: int


def _waves(programs: int, sms: int) -> int:
    return math.ceil(programs / sms)


def _stream(tokens: int, H: int, vocab: int, stream_block: int, tile: int, s: int, sms: int) -> int:
    """Programs over `tokens` blocks of stream_block rows, each streaming `vocab` rows of the other operand
    (shared by a wave) and re-reading its own block once per tile of `tile` rows."""
    shared = _waves(math.ceil(tokens / stream_block), sms) * vocab * H * s
    return shared + math.ceil(vocab / tile) * tokens * H * s


def forward_bytes(N: int, H: int, V: int, tiles: Tiles, s: int = 2, sms: int = 132) -> int:
    return _stream(N, H, V, tiles.block_n, tiles.block_v, s, sms) + 4 * 3 * N


def grad_hidden_bytes(N: int, H: int, V: int, tiles: Tiles, s: int = 2, sms: int = 132) -> int:
    accumulator = math.ceil(V / tiles.block_v) * N * H * 4 * 2
    return _stream(N, H, V, tiles.block_n, tiles.block_v, s, sms) + accumulator + N * H * (4 + s)


def grad_weight_bytes(N: int, H: int, V: int, tiles: Tiles, s: int = 2, sms: int = 132) -> int:
    # the roles swap: programs own vocabulary blocks and stream the hidden states
    accumulator = math.ceil(N / tiles.block_n) * V * H * 4 * 2
    return _stream(V, H, N, tiles.block_v, tiles.block_n, s, sms) + accumulator + V * H * (4 + s)


def gemm_bytes(N: int, H: int, V: int, s: int = 2) -> dict:
    """Bytes of the GEMMs the streaming kernels replace, each operand read and result written once."""
    logits = (N * H + V * H + N * V) * s
    return {"forward": logits, "backward": logits + (N * V + V * H + N * H) * s + (N * V + N * H + V * H) * s}


def streaming_bytes(N: int, H: int, V: int, forward: Tiles, grad_hidden: Tiles, grad_weight: Tiles, s: int = 2,
                    sms: int = 132) -> dict:
    return {"forward": forward_bytes(N, H, V, forward, s, sms),
            "grad_hidden": grad_hidden_bytes(N, H, V, grad_hidden, s, sms),
            "grad_weight": grad_weight_bytes(N, H, V, grad_weight, s, sms)}


def table(N: int, H: int, V: int, s: int, sms: int, layouts: dict) -> str:
    gemm = gemm_bytes(N, H, V, s)
    lines = [f"N={N}, H={H}, V={V}, {s}-byte inputs, {sms} SMs; "
             f"GEMMs replaced: forward {gemm['forward'] / 1e9:.1f} GB, "
             f"backward {gemm['backward'] / 1e9:.1f} GB", "",
             "| tiles | forward GB | x GEMM | dH GB | dW GB | backward GB | x GEMM |", "|---|---|---|---|---|---|---|"]
    for name, (fwd, dh, dw) in layouts.items():
        b = streaming_bytes(N, H, V, fwd, dh, dw, s, sms)
        backward = b["grad_hidden"] + b["grad_weight"]
        lines.append(f"| {name} | {b['forward'] / 1e9:.1f} | {b['forward'] / gemm['forward']:.1f} | "
                     f"{b['grad_hidden'] / 1e9:.1f} | {b['grad_weight'] / 1e9:.1f} | {backward / 1e9:.1f} | "
                     f"{backward / gemm['backward']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    from grpo_kernels.kernels.configs import GPU_CONFIGS, SIXTEEN_BIT

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--N", type=int, default=8192)
    parser.add_argument("--H", type=int, default=4096)
    parser.add_argument("--V", type=int, default=151936)
    parser.add_argument("--sms", type=int, default=132, help="132: H100 SXM and H200")
    args = parser.parse_args(argv)

    def tiles(arch, kernel):
        c = GPU_CONFIGS[arch][kernel][SIXTEEN_BIT]
        return Tiles(c.block_n, c.block_v)

    layouts = {"before (64x128 everywhere)": (Tiles(64, 128), Tiles(64, 128), Tiles(64, 128))}
    for arch in ("sm90", "sm80"):
        layouts[f"{arch} table"] = (tiles(arch, "forward"), tiles(arch, "grad_hidden"), tiles(arch, "grad_weight"))
    print(table(args.N, args.H, args.V, 2, args.sms, layouts))


if __name__ == "__main__":
    main()
