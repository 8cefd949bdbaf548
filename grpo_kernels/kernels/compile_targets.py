"""Every GPU kernel build the launchers can ask for, as arguments of `triton.compile`: the kernel, its
argument types, its constexprs and its warps / stages, per architecture table and input dtype.

benchmarks/model/kernel_report.py compiles them for sm_90a and sm_80 without a GPU; the CI test compiles the
heaviest variant of each. Keep this in step with the launchers: a kernel or flag added there belongs here.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from .configs import GPU_CONFIGS, KernelConfig, dtype_class
from .linear_forward import GROUP_N
from .persistent_forward import GROUP_N as PERSISTENT_GROUP_N
from .tile_backward import GROUP_N as TILE_GROUP_N

DTYPES = ("fp32", "bf16", "fp16")
ARCHS = {"sm90": 90, "sm80": 80}  # table name -> compute capability compiled for (90 = sm_90a)

# pointer arguments in the input's dtype; every other pointer is float32 except these
_INPUT_POINTERS = {"hidden_ptr", "weight_ptr", "bias_ptr", "logits_ptr", "grad_logits_ptr", "dz_ptr", "a_ptr",
                   "b_ptr", "chunk_ptr"}
_OTHER_POINTERS = {"targets_ptr": "*i64", "clip_ptr": "*i8"}
_FLOAT_SCALARS = {"inv_tau", "cap_scale", "eps_low", "eps_high", "delta", "beta", "sapo_pos", "sapo_neg"}
# as the JIT specializes them for real heads (V a multiple of 8 makes the GEMM path's row strides so too)
_MULTIPLE_OF_16 = {"H", "split_width", "stride_hidden", "stride_weight", "stride_z", "stride_dz", "stride_ak", "stride_bk",
                   "stride_cm", "stride_chunk"}


@dataclass(frozen=True)
class CompileTarget:
    kernel: str  # the @triton.jit function's name
    table: str  # configs.py kernel entry
    arch: str  # "sm90" | "sm80"
    dtype: str  # input dtype
    variant: str  # the constexpr flags, readable
    config: KernelConfig
    constexprs: tuple  # ((name, value), ...)
    tensor_cores: bool  # its dots run on tensor cores (16-bit inputs): Hopper builds must use wgmma
    # On the Hopper recipe's path (persistent_forward.py, chunk_grad.py, persistent_grad.py, the merges: the
    # triton_tma backend, and the triton backend's forward on Hopper): a Hopper tensor-core build there must also
    # load through TMA.
    hot_path: bool = False

    @property
    def capability(self) -> int:
        return ARCHS[self.arch]

    def jit_function(self):
        from . import (accumulate_mm, chunk_grad, linear_backward, linear_forward, logits, persistent_forward,
                       persistent_grad, rows, tile_backward)

        for module in (linear_forward, linear_backward, tile_backward, logits, rows, accumulate_mm,
                       persistent_forward, chunk_grad, persistent_grad):
            if hasattr(module, self.kernel):
                return getattr(module, self.kernel)
        raise LookupError(f"no kernel named {self.kernel}")

    def all_constexprs(self, fn) -> dict:
        """This target's constexprs, plus the defaults of those the launchers leave out."""
        defaults = {name: param.default for name, param in zip(fn.arg_names, fn.params)
                    if param.is_constexpr and param.has_default}
        return {**defaults, **dict(self.constexprs)}

    def signature(self, fn) -> tuple[dict, dict]:
        """(signature, attrs) of triton.compiler.ASTSource for this target."""
        constexprs = dict(self.constexprs)
        signature, attrs = {}, {}
        for index, (name, param) in enumerate(zip(fn.arg_names, fn.params)):
            if param.is_constexpr:
                signature[name] = "constexpr"
                continue
            if name.endswith("_ptr"):
                signature[name] = "*" + self.dtype if name in _INPUT_POINTERS else _OTHER_POINTERS.get(name, "*fp32")
                attrs[(index,)] = [["tt.divisibility", 16]]
            elif name in _FLOAT_SCALARS:
                signature[name] = "fp32"
            else:
                signature[name] = "i32"
                if name in _MULTIPLE_OF_16:
                    attrs[(index,)] = [["tt.divisibility", 16]]
        missing = [name for name, param in zip(fn.arg_names, fn.params)
                   if param.is_constexpr and name not in constexprs and not param.has_default]
        if missing:
            raise ValueError(f"{self.kernel}: constexprs {missing} not set by compile_targets")
        return signature, attrs

    def row(self) -> dict:
        c = self.config
        return dict(kernel=self.kernel, arch=self.arch, dtype=self.dtype, variant=self.variant, block_n=c.block_n,
                    block_v=c.block_v, block_k=c.block_k, split_tiles=c.split_tiles, num_warps=c.num_warps,
                    num_stages=c.num_stages, hot_path=self.hot_path)


def _flags_text(flags: dict) -> str:
    on = [f"{k}={v}" if not isinstance(v, bool) else k for k, v in flags.items() if v is not False]
    return ",".join(on) or "-"


def _targets(kernel: str, table: str, arch: str, dtype: str, variants: list[dict], linear: bool, has_blocks=True,
             fixed: dict | None = None, hot_path: bool = False, config: KernelConfig | None = None):
    """fixed: constexprs every variant sets, not shown in the variant's name; hot_path: CompileTarget's (Hopper
    builds only); config: another entry than the table's (a tile sweep's candidate)."""
    config = config or GPU_CONFIGS[arch][table][dtype_class(dtype == "fp32")]
    for flags in variants:
        constexprs = dict(flags, **(fixed or {}))
        if linear:
            constexprs.update(UPCAST=False, PRECISION="ieee" if dtype == "fp32" else "tf32")
        blocks = config.launch_options(interpreted=True)  # the blocks and the flags the entry sets
        if not has_blocks:
            blocks.pop("BLOCK_V")
        constexprs.update(blocks)
        yield CompileTarget(kernel, table, arch, dtype, _flags_text(flags), config, tuple(constexprs.items()),
                            tensor_cores=linear and dtype != "fp32", hot_path=hot_path and arch == "sm90")


def persistent_forward_target(config: KernelConfig, dtype: str = "bf16", **flags) -> CompileTarget:
    """The Hopper build of persistent_forward.py's kernel under `config` (a tile sweep's candidate, e.g.
    benchmarks.triton_check.persistent_variants) with the constexpr `flags` given (HAS_BIAS, SOFTCAP, STORE_CHUNK)."""
    flags = dict(dict(HAS_BIAS=False, SOFTCAP=False, STORE_CHUNK=False), **flags)
    return next(_targets("_persistent_stats_kernel", "persistent", "sm90", dtype, [flags], True,
                         fixed=dict(GROUP=PERSISTENT_GROUP_N), hot_path=True, config=config))


def _grid(**choices) -> list[dict]:
    names = list(choices)
    return [dict(zip(names, values)) for values in itertools.product(*(choices[n] for n in names))]


# The GRPO epilogue at its heaviest (every optional input given) for each loss kind; the other flags only
# remove work.
_GRPO_FLAGS = _grid(LOSS_KIND=[0, 1, 2], HAS_OLD=[True], HAS_REF=[True], HAS_RHO=[True], HAS_DELTA=[True],
                    BIAS_CORRECTION=[True], HAS_ENTROPY_BONUS=[True])


def _gemm_path_targets(arch: str, dtype: str, bias: list, ent: list, cap: list) -> list[CompileTarget]:
    """The GEMM path's kernels (kernels/rows.py, kernels/accumulate_mm.py): their launch options are fixed in
    those files, not per-arch tables; the report holds them to the same rules."""
    from .accumulate_mm import GPU_BLOCKS
    from .rows import GPU_BLOCK_V, GPU_ROW_WARPS

    row_config = KernelConfig(block_n=1, block_v=GPU_BLOCK_V, num_warps=GPU_ROW_WARPS, num_stages=1)
    out = [CompileTarget("_row_stats_kernel", "rows", arch, dtype, _flags_text(flags), row_config,
                         (*flags.items(), ("BLOCK_V", GPU_BLOCK_V)), tensor_cores=False)
           for flags in _grid(HAS_BIAS=bias, SOFTCAP=cap)]
    out += [CompileTarget("_row_grad_kernel", "rows", arch, dtype, _flags_text(flags), row_config,
                          (*flags.items(), ("BLOCK_V", GPU_BLOCK_V)), tensor_cores=False)
            for flags in _grid(HAS_BIAS=bias, HAS_ENT_GRAD=ent, SOFTCAP=cap)]
    if dtype != "fp32":  # float32 operands accumulate with torch's addmm
        blocks = {k: v for k, v in GPU_BLOCKS.items() if k not in ("num_warps", "num_stages")}
        config = KernelConfig(block_n=blocks["BLOCK_N"], block_v=blocks["BLOCK_M"], block_k=blocks["BLOCK_K"],
                              num_warps=GPU_BLOCKS["num_warps"], num_stages=GPU_BLOCKS["num_stages"])
        out.append(CompileTarget("_accumulate_at_b_kernel", "accumulate_mm", arch, dtype, "-", config,
                                 tuple({**blocks, "UPCAST": False}.items()), tensor_cores=True))
    return out


def all_targets(heaviest_only: bool = False, dtypes: tuple = DTYPES) -> list[CompileTarget]:
    """Every (kernel, arch, dtype, constexpr variant) build; heaviest_only keeps, per kernel, arch and dtype,
    the variant with every register-costing flag on (what a spill check needs)."""
    bias = [True] if heaviest_only else [False, True]
    ent = [True] if heaviest_only else [False, True]
    cap = [True] if heaviest_only else [False, True]  # SOFTCAP: a soft-capped head (head.py)
    kinds = _GRPO_FLAGS
    out: list[CompileTarget] = []
    for arch, dtype in itertools.product(ARCHS, dtypes):
        out += _targets("_partial_stats_kernel", "forward", arch, dtype,
                        _grid(HAS_BIAS=bias, SOFTCAP=cap), True, fixed=dict(GROUP=GROUP_N))
        # OWNS_VOCAB in the variant's name: dH and dW builds of one tile shape must not share a report key
        for table, owns_vocab in (("grad_hidden", False), ("grad_weight", True)):
            out += _targets("_grad_kernel", table, arch, dtype,
                            _grid(OWNS_VOCAB=[owns_vocab], HAS_BIAS=bias, HAS_ENT_GRAD=ent, SOFTCAP=cap), True)
        # the opt-in one-kernel backward (a trained head only)
        out += _targets("_tile_grad_kernel", "grad_tiles", arch, dtype,
                        _grid(HAS_BIAS=bias, HAS_ENT_GRAD=ent, SOFTCAP=cap), True, fixed=dict(GROUP=TILE_GROUP_N))
        # the Hopper recipe: the persistent TMA forward (also storing a chunk of exponentials) and the chunk's dz pass
        out += _targets("_persistent_stats_kernel", "persistent", arch, dtype,
                        _grid(HAS_BIAS=bias, SOFTCAP=cap, STORE_CHUNK=[True] if heaviest_only else [False, True]),
                        True, fixed=dict(GROUP=PERSISTENT_GROUP_N), hot_path=True)
        out += _targets("_chunk_grad_kernel", "chunk_grad", arch, dtype, _grid(HAS_ENT_GRAD=ent, SOFTCAP=cap), False,
                        hot_path=True)
        # and the two-pass backward's tiles, dz formed in the epilogue (persistent_grad.py)
        out += _targets("_persistent_dz_kernel", "persistent_dz", arch, dtype,
                        _grid(HAS_BIAS=bias, HAS_ENT_GRAD=ent, SOFTCAP=cap), True,
                        fixed=dict(GROUP=PERSISTENT_GROUP_N), hot_path=True)
        out += _targets("_logits_forward_kernel", "logits", arch, dtype, [{}], False)
        out += _targets("_logits_backward_kernel", "logits", arch, dtype, _grid(HAS_ENT_GRAD=ent), False)
        out += _gemm_path_targets(arch, dtype, bias, ent, cap)
        if dtype == dtypes[0]:
            # the merge reads only float32 statistics: one build per arch
            out += _targets("_merge_logprobs_kernel", "merge", arch, "fp32", [{}], False, has_blocks=False,
                            hot_path=True)
            out += _targets("_merge_grpo_kernel", "merge", arch, "fp32", kinds, False, has_blocks=False,
                            hot_path=True)
    return out
