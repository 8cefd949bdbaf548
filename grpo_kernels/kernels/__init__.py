"""Triton kernels, one family a file; `launch` is the only module the rest of the package imports.

- tiles.py           shared @triton.jit helpers: a logits tile, its softmax gradient, the logit transform
                     (tanh soft-cap and scale, behind the SOFTCAP constexpr) and its chain rule
- linear_forward.py  hidden x LM head -> log-prob, entropy, lse: a 2-D grid of token blocks x fixed vocabulary
                     splits (partial statistics), a fixed-order merge, the GRPO epilogue in the merge
- persistent_forward.py the Hopper recipe of the forward: one program per SM over the same work items, operands
                     through tensor descriptors (TMA), statistics in the tile GEMM's epilogue; optionally stores the
                     float32 logits of a token chunk (backends/triton_tma.py)
- chunk_grad.py      a stored chunk of exponentials -> dz in the input dtype, in place
- linear_backward.py recompute logits tile by tile -> dH (programs own tokens), dW and dbias (programs own vocab)
- logits.py          the same statistics and gradient when the caller already holds the logits
- configs.py         block / warp / stage tables per GPU architecture (sm_90, sm_80, default) and the interpreter's
- compile_targets.py every GPU build the launchers can choose, for benchmarks/model/kernel_report.py and its CI test
- interpreter_compat.py lets triton 3.6's interpreter loop over runtime bounds with numpy >= 2.4
"""
