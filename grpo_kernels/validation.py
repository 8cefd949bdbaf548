"""Input checks shared by every path: bad input fails here, naming the argument, before any kernel runs.

Two kinds: shape, dtype and device checks read only metadata and always run, under torch.compile too; value checks
(NaN scans, id ranges, 0/1 masks) read the data, synchronise with the device and would break a compiled graph, so
they take `check_values` (the API passes False while compiling)."""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch._subclasses.fake_tensor import FakeTensor

from .argument_names import LOSS_NAMES, ArgumentNames
from .config import MAX_TEMPERATURE, MIN_TEMPERATURE, GRPOLossConfig, warn_at_caller
from .losses import get_loss_type, validate_loss_params
from .head import IDENTITY, LMHead, LogitTransform
from .messages import shown
from .scalars import finite_real, integer_value

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
# The integer dtypes ids, offsets, masks and counts may come in: those torch computes with (read as int64 by
# as_token_ids). Named one by one rather than as "not float, complex or bool": torch has integer-like dtypes with no
# kernels at all (int1..int7, uint1..uint7, bits8, ...), which failed inside a copy with NotImplementedError.
_INTEGER_DTYPES = tuple(getattr(torch, name) for name in ("int8", "uint8", "int16", "int32", "int64", "uint16",
                                                           "uint32", "uint64") if hasattr(torch, name))
# A mask is compared and multiplied on the device: torch's unsigned 16-64-bit dtypes have few device kernels (ids
# and offsets in them are read as int64 first; a mask in them is refused rather than failing on a GPU)
_MASK_DTYPES = (torch.bool, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, *_FLOAT_DTYPES)
_COUNT_DTYPES = (*_INTEGER_DTYPES, *_FLOAT_DTYPES)


def _require_tensor(name: str, x: object) -> torch.Tensor:
    """A dense (strided) tensor: every backend indexes, reshapes and reduces its inputs as dense memory, which a
    sparse, nested or quantized tensor is not (each failed deep inside an operator with a NotImplementedError)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.layout != torch.strided or x.is_nested or x.is_quantized:
        kind = "nested" if x.is_nested else "quantized" if x.is_quantized else str(x.layout).removeprefix("torch.")
        raise TypeError(f"{name} must be a dense (strided) tensor, got a {kind} one; convert it first "
                        f"(.to_dense(), .dequantize(), or pad a nested tensor)")
    if not torch.compiler.is_compiling():  # a compiled graph is traced with fake tensors: these are its inputs
        _refuse_traced(name, x)
    return x


def _refuse_traced(name: str, x: torch.Tensor) -> None:
    """A tensor of a torch.func transform (vmap, grad, jacrev, ...), a FakeTensor or any other tensor subclass
    that overrides __torch_dispatch__ (TwoTensor, a DTensor outside the head, torchao's wrappers), outside
    torch.compile: the loss's custom autograd functions are not functorch-aware (torch.func.grad failed in autograd,
    vmap at a data pointer, each in torch's words), its checks read values a FakeTensor has not got (a
    DataDependentOutputException), and a wrapper subclass failed in the finiteness scan's .tolist() or at the
    kernels' storage access, or came back as the subclass on one backend only. Refused alike on every backend,
    before any work; a plain subclass (nn.Parameter's, a __torch_function__ one) is a tensor like any other. A
    vocabulary-sharded DTensor head is unwrapped to its shard before this check (backends/sharded_head.py)."""
    if torch._C._functorch.is_functorch_wrapped_tensor(x):
        raise TypeError(f"{name} is a tensor of a torch.func transform (vmap, grad, jacrev, ...), which the fused "
                        f"loss does not run under; call it outside the transform (a per-example loss: pass the batch "
                        f"and keep the per-token values)")
    if isinstance(x, FakeTensor):
        raise TypeError(f"{name} is a FakeTensor: it has a shape but no values to check or compute with; call the "
                        f"loss on real tensors (torch.compile traces it with fake ones itself)")
    if type(x).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__:
        raise TypeError(f"{name} is a {type(x).__name__}, a tensor subclass with its own __torch_dispatch__, whose "
                        f"elements the loss's kernels cannot read; pass a plain torch.Tensor (a DTensor: "
                        f".full_tensor() or .to_local())")


def check_optional_tensors(**named: object) -> None:
    """Arguments a call may leave unused (the Liger module's reference inputs without a KL term): each None or a
    dense tensor, whether it is read or not. Unused, any value was taken before: a string or a list in place of a
    tensor passed silently with beta=0 and failed only once a config turned the KL term on."""
    for name, x in named.items():
        if x is not None:
            _require_tensor(name, x)


def _require_integer(name: str, x: torch.Tensor, what: str) -> None:
    if x.dtype not in _INTEGER_DTYPES:
        raise TypeError(f"{name} must be an integer tensor ({what}; int64, int32, ... or uint8), got {x.dtype}")


def _require_float(name: str, x: torch.Tensor) -> None:
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating tensor (float32, bfloat16, float16 or float64), got {x.dtype}")


def _largest_magnitude(x: torch.Tensor) -> torch.Tensor:
    """A 0-d float64 tensor: max |x|, NaN-propagating, so finite exactly when every element is: one reduction that
    reads x once and writes nothing of its size (torch.isfinite(x).all() makes four elementwise passes and a
    boolean copy of x: 2.4 ms of a 19.5 ms log-prob step for S1's head on an H200)."""
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float64, device=x.device)
    # A broadcast (stride-0) dimension repeats the same elements: scanned once (an expanded [2**31, H] head is
    # H values, not 2**31 * H to read)
    distinct = x[tuple(slice(0, 1) if stride == 0 else slice(None) for stride in x.stride())]
    return torch.linalg.vector_norm(distinct, float("inf")).double()


def _require_finite(**named: torch.Tensor) -> dict[str, float]:
    """Every named tensor finite; one host sync for all of them, the first bad one named. Returns each one's
    largest magnitude."""
    largest = torch.stack([_largest_magnitude(x) for x in named.values()]).tolist()
    for name, value in zip(named, largest):
        if not math.isfinite(value):
            raise ValueError(f"{name} contains NaN or Inf values")
    return dict(zip(named, largest))


def _require_logits_in_range(names: ArgumentNames, hidden: torch.Tensor, largest: dict[str, float],
                             logit_factor: float) -> None:
    """Finite inputs whose logits could pass the compute dtype's range: H max|hidden| max|weight| (+ max|bias|) times
    the head's largest factor bounds every logit (each product, and each partial sum of the float32 accumulation).
    Past a quarter of the dtype's largest value the logits, or the log-probs and log-ratios taken from them, could
    overflow: every backend returned NaN log-probs and losses without an error (the float64 reference: finite ones)."""
    bound = hidden.shape[-1] * largest[names.hidden] * largest[names.weight] + largest.get(names.bias, 0.0)
    bound *= logit_factor
    bias = f" + max|{names.bias}|" if names.bias in largest else ""
    factor = " times the head's largest factor (1 / temperature, logit scale)" if logit_factor != 1 else ""
    _require_within_range(f"{names.hidden} and {names.weight} are", hidden.dtype,
                          f"H x max|{names.hidden}| x max|{names.weight}|{bias}{factor}", bound)


def _require_within_range(what: str, dtype: torch.dtype, formula: str, bound: float, of: str = "the logits'") -> None:
    """`bound` (a bound on every logit, written as `formula`) within a quarter of the largest value of the dtype the
    logits are computed in (float64 for float64 inputs, else float32)."""
    name = "float64" if dtype == torch.float64 else "float32"
    limit = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).max / 4
    if not bound <= limit:
        raise ValueError(f"{what} too large for {of} {name} range: {formula} = {bound:.3g}, past "
                         f"{limit:.3g} (a quarter of its largest value, so that log-probs and log-ratios stay finite); "
                         f"scale them down")


def require_data(name: str, x: torch.Tensor) -> None:
    if x.device.type == "meta":
        raise ValueError(f"{name} is on the meta device: it has a shape but no values to compute with; "
                         "materialise it (e.g. model.to_empty(device=...) and load the weights) first")


def _require_device(name: str, x: torch.Tensor, device: torch.device, anchor: str = "hidden/logits") -> None:
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but {anchor} is on {device}; put all inputs on one device")


def _require_constant(name: str, x: torch.Tensor) -> None:
    """The mask, advantages, old / reference log-probs, ratios and token count are constants of the objective. A
    gradient asked of one was three different things before: the two-step route differentiated it, the Triton
    epilogue dropped it silently and the GEMM path's one-pass route failed inside backward. Refused here, alike on
    every backend (only while autograd records: under no_grad nothing would flow into it)."""
    if x.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{name} requires grad, but the loss takes it as a constant (no gradient flows into it on "
                         f"any backend); pass {name}.detach()")


# The largest vocabulary and the most token rows: the kernels compare token ids with a tile's vocabulary ids in
# int32 (kernels/tiles.py), and number a block's rows in int32 (program id * BLOCK_N + arange); torch's own gathers
# index a row of logits with them. A head past it (an expanded, stride-0 weight costs no memory) ran for minutes and
# failed allocating its gradient; an expanded [2**31, H] hidden failed in the allocator (68 GB for its rows).
MAX_INT32_COUNT = 2**31 - 1
MAX_VOCAB_SIZE = MAX_TOKEN_ROWS = MAX_INT32_COUNT


def _check_int32_count(name: str, count: int, what: str, why: str) -> None:
    if count > MAX_INT32_COUNT:
        raise ValueError(f"{name} has {what} of {count} rows; at most 2**31 - 1 = {MAX_INT32_COUNT} are supported "
                         f"({why} are int32 inside the kernels)")


def check_vocab_size(name: str, vocab_size: int) -> None:
    _check_int32_count(name, vocab_size, "a vocabulary", "token ids")


def check_token_rows(name: str, shape: torch.Size) -> None:
    """Every dimension of `shape` but the last (the hidden size or the vocabulary) counts token rows."""
    _check_int32_count(name, math.prod(shape[:-1]), "a batch (every dimension but the last)", "row indices")


def check_config(config: object) -> GRPOLossConfig:
    """None means the defaults (TRL's): one instance made outside any call, as a compiled graph cannot trace the
    checks a config runs on construction (typing's hints)."""
    if config is None:
        return _DEFAULT_CONFIG
    if not isinstance(config, GRPOLossConfig):
        raise TypeError(f"config must be a GRPOLossConfig, got {type(config).__name__}")
    if not torch.compiler.is_compiling():
        # The config is frozen but its loss_params is a dict (what asdict, JSON and YAML write), which a caller can
        # still write to: its values are checked again here, as on construction, so that a value changed since
        # is refused by its name rather than failing inside the loss type's term.
        validate_loss_params(config.loss_type, config.loss_params, key="config.loss_params")
    return config


def check_backend_dtype(backend: str, hidden: torch.Tensor, name: str) -> None:
    """The backend computes in hidden's dtype (its BackendSpec.dtypes): refused here, the same way for every
    backend, rather than inside a kernel launch."""
    from .backends import AUTO, BACKENDS, get_backend

    _require_float(name, hidden)  # a non-float tensor is no backend's dtype: named as such, not as a backend's gap
    if backend == AUTO:
        return
    spec = get_backend(backend)
    dtype = str(hidden.dtype).removeprefix("torch.")
    if dtype not in spec.dtypes:
        others = [other for other, entry in BACKENDS.items() if dtype in entry.dtypes]
        raise TypeError(f"backend={backend!r} computes in {', '.join(spec.dtypes)}, got {name} of {hidden.dtype}; "
                        f"use backend={AUTO!r} or one of {', '.join(others)} for {dtype}")


def outside_inference_mode(*tensors: Optional[object]) -> tuple[Optional[object], ...]:
    """Tensors made under torch.inference_mode() cannot be saved for backward: a backend that saves one (the
    targets of a gather, the mask, the advantages) would fail deep inside autograd, another that does not would
    run. When autograd records (grad mode on, outside inference mode), such a tensor is replaced by an ordinary
    copy here, for every backend alike; inside inference mode (or no_grad) the tensors are used as they are."""
    if torch.compiler.is_compiling() or torch.is_inference_mode_enabled() or not torch.is_grad_enabled():
        return tensors  # a compiled graph gets no inference tensors from the caller
    return tuple(x.clone() if isinstance(x, torch.Tensor) and x.is_inference() else x for x in tensors)


def bias_in_weight_dtype(weight: torch.Tensor, bias: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A bias of another float dtype than the weight enters the logits in the weight's dtype on every backend:
    cast here, differentiably (its gradient comes back in its own dtype)."""
    if bias is None or not isinstance(bias, torch.Tensor) or not isinstance(weight, torch.Tensor):
        return bias
    if bias.dtype != weight.dtype and bias.dtype in _FLOAT_DTYPES and weight.dtype in _FLOAT_DTYPES:
        return bias.to(weight.dtype)
    return bias


def check_targets(name: str, targets: object, shape: tuple[int, ...], vocab_size: int, device: torch.device,
                  check_values: bool = True, anchor: str = "hidden/logits") -> None:
    targets = _require_tensor(name, targets)
    _require_integer(name, targets, "token ids")
    if tuple(targets.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(targets.shape)}")
    _require_device(name, targets, device, anchor)
    if check_values and targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= vocab_size):
        raise ValueError(
            f"{name} must hold token ids in [0, {vocab_size}), "
            f"got values in [{int(targets.min())}, {int(targets.max())}]"
        )


def ids_where_scored(ids: object, mask: object) -> object:
    """Token ids with the positions `mask` leaves out set to 0: whatever a caller pads with there (-100, HF's
    ignore index for labels; a pad id past the head's rows) is never scored, and Liger's chunked loss and TRL take
    it (only masked positions are read). Before, an id outside [0, V) at a padded position was refused like one at
    a scored position. Anything that is not a plain dense integer tensor beside a mask of its shape and device is
    returned as it is, for the checks to name."""
    if not (_plain(ids) and _plain(mask) and ids.dtype in _INTEGER_DTYPES and mask.dtype in _MASK_DTYPES
            and ids.shape == mask.shape and ids.device == mask.device and ids.device.type != "meta"):
        return ids
    if ids.numel() > MAX_TOKEN_ROWS:  # the size check refuses it before any allocation (a stride-0 batch costs none)
        return ids
    return as_token_ids(ids).masked_fill(mask == 0, 0)  # int64 first: masked_fill has no kernel for uint16-uint64


def _plain(x: object) -> bool:
    """A dense tensor whose elements this process can read (what _require_tensor and _refuse_traced accept; a
    compiled graph's inputs are fake tensors by design, and dynamo cannot trace the functorch query)."""
    if not isinstance(x, torch.Tensor) or x.layout != torch.strided or x.is_nested or x.is_quantized:
        return False
    return torch.compiler.is_compiling() or (
        not isinstance(x, FakeTensor) and not torch._C._functorch.is_functorch_wrapped_tensor(x)
        and type(x).__torch_dispatch__ is torch.Tensor.__torch_dispatch__)


def as_token_ids(ids: object) -> object:
    """Integer token ids (or sequence offsets) of any width (int16, uint8, int32...) as the int64 the gathers and
    torch's index ops take (repeat_interleave has no uint8 kernel); anything else as it is, for the checks to
    name."""
    if isinstance(ids, torch.Tensor) and ids.dtype != torch.int64 and ids.dtype in _INTEGER_DTYPES:
        return ids.long()
    return ids


def check_logit_transform(transform: object) -> LogitTransform:
    """None (the model's plain logits) or a LogitTransform."""
    if transform is None:
        return IDENTITY
    if not isinstance(transform, LogitTransform):
        raise TypeError(f"logit_transform must be a grpo_kernels.LogitTransform (or None), got "
                        f"{type(transform).__name__}")
    # The fused backends compute the transform from its two numbers (LMHead.logit_constants); only the reference
    # calls apply(). A subclass redefining what the transform does gave one loss on the reference and another on
    # every other backend, silently.
    redefined = [name for name in ("apply", "is_identity")
                 if getattr(type(transform), name) is not getattr(LogitTransform, name)]
    if redefined:
        raise TypeError(f"logit_transform: {type(transform).__name__} redefines LogitTransform."
                        f"{' and '.join(redefined)}, which the fused backends do not follow (they compute the "
                        f"transform from its scale and softcap alone); pass a LogitTransform(scale=..., softcap=...)")
    return transform


# The largest factor the softmax's logits may be multiplied by: scale / temperature (softcap / temperature and
# scale / softcap with a soft-cap), LMHead.logit_constants, which every backend multiplies float32 logits by. The
# same bound as MIN_TEMPERATURE's (1 / 1e-30): a LogitTransform(scale=1e200), or a scale of 1e30 over a temperature
# of 1e-30, is each finite alone, but its factor is infinite in float32 and every log-prob came back NaN, silently.
# The scale and the soft-cap themselves too: the reference multiplies float32 logits by each before the temperature.
# With a soft-cap the backward also divides by softcap / temperature (the tanh from the capped logits): below
# 1 / MAX_LOGIT_FACTOR its reciprocal left float32 (softcap=1 at temperature=1e39) and every gradient was NaN.
MAX_LOGIT_FACTOR = 1 / MIN_TEMPERATURE


def check_logit_factors(transform: LogitTransform, temperature: float, temperature_name: str = "temperature"
                        ) -> float:
    """The constants the kernels multiply the logits by, each at most MAX_LOGIT_FACTOR in magnitude, and the
    soft-cap's outer factor (which the backward divides by) at least its reciprocal."""
    # the head's own constants, as every backend computes them (they read no weight)
    inv_tau, cap_scale = LMHead(None, temperature=temperature, transform=transform).logit_constants
    # the reference (and a model) also multiply float32 logits by the scale, and divide them by the soft-cap, alone
    factors = [abs(inv_tau), abs(transform.scale)] + ([] if cap_scale is None else [abs(cap_scale), transform.softcap])
    largest = max(factors)
    problem = None
    if not largest <= MAX_LOGIT_FACTOR:
        problem = f"has a logit factor of {largest:g}, past {MAX_LOGIT_FACTOR:g} (float32 logits times more " \
                  "overflow to NaN log-probs)"
    elif cap_scale is not None and inv_tau < 1 / MAX_LOGIT_FACTOR:
        problem = f"caps the logits at softcap / temperature = {inv_tau:g}, below {1 / MAX_LOGIT_FACTOR:g} (the " \
                  "backward divides by it in float32: NaN gradients)"
    if problem:
        raise ValueError(f"logit_transform (scale={transform.scale:g}, softcap={transform.softcap}) with "
                         f"{temperature_name}={temperature:g} {problem}; keep scale, softcap and their ratios to "
                         f"each other and to the temperature at most {MAX_LOGIT_FACTOR:g} in magnitude, and softcap / "
                         f"temperature at least {1 / MAX_LOGIT_FACTOR:g}")
    return largest


def check_linear_inputs(hidden: object, weight: object, bias: Optional[object], check_finite: bool = True,
                        names: ArgumentNames = LOSS_NAMES, logit_factor: float = 1.0) -> None:
    """hidden [..., H] and weight [V, H] (and bias [V]) of one float dtype family on one device; with check_finite
    also finite and within the logits' range once multiplied by `logit_factor` (check_logit_factors' largest)."""
    hidden = _require_tensor(names.hidden, hidden)
    weight = _require_tensor(names.weight, weight)
    _require_float(names.hidden, hidden)
    _require_float(names.weight, weight)
    require_data(names.hidden, hidden)  # before the device checks: a meta hidden is named, not the weight beside it
    if hidden.dim() < 1 or hidden.shape[-1] == 0:
        raise ValueError(f"{names.hidden} must be [..., H] with a hidden size H >= 1, got shape "
                         f"{list(hidden.shape)}")
    check_token_rows(names.hidden, hidden.shape)
    if weight.dim() != 2:
        raise ValueError(f"{names.weight} must be [V, H], got shape {list(weight.shape)}")
    if weight.shape[1] != hidden.shape[-1]:
        # nn.Linear stores [out, in] = [V, H]; its .T (or a head kept as [H, V]) is the likeliest mismatch
        transposed = ("; it looks transposed ([H, V]): pass the head's weight as nn.Linear stores it, [V, H], not "
                      "its .T") if weight.shape[0] == hidden.shape[-1] else ""
        raise ValueError(f"hidden size mismatch: {names.hidden} has H={hidden.shape[-1]} but {names.weight} is "
                         f"[V, H]={list(weight.shape)}{transposed}")
    if weight.shape[0] == 0:
        raise ValueError(f"{names.weight} must have at least one vocabulary row")
    check_vocab_size(names.weight, weight.shape[0])
    if weight.dtype != hidden.dtype:
        raise TypeError(f"{names.weight} dtype {weight.dtype} must match {names.hidden} dtype {hidden.dtype}")
    _require_device(names.weight, weight, hidden.device, names.hidden)
    if bias is not None:
        bias = _require_tensor(names.bias, bias)
        _require_float(names.bias, bias)
        if tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"{names.bias} must have shape [V]=[{weight.shape[0]}], got {list(bias.shape)}")
        _require_device(names.bias, bias, hidden.device, names.hidden)
    if check_finite:
        largest = _require_finite(**{names.hidden: hidden, names.weight: weight},
                                  **({} if bias is None else {names.bias: bias}))
        _require_logits_in_range(names, hidden, largest, logit_factor)


def check_logits(logits: object, check_finite: bool = True, temperature: float = 1.0) -> None:
    """logits [B, T, V] of a float dtype; with check_finite also finite, and divided by `temperature` within the
    range of the float32 log-probs taken from them: finite logits of 1e38 (or 1e36 at temperature 0.01) gave NaN
    log-probs and losses without an error, as a head's did before its own check (_require_logits_in_range)."""
    logits = _require_tensor("logits", logits)
    _require_float("logits", logits)
    require_data("logits", logits)
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, T, V], got shape {list(logits.shape)}")
    if logits.shape[-1] == 0:
        raise ValueError("logits must have a non-empty vocabulary dimension")
    check_vocab_size("logits", logits.shape[-1])
    check_token_rows("logits", logits.shape)
    if check_finite:
        largest = _require_finite(logits=logits)["logits"]
        # the log-probs come out float32 whatever the logits' dtype: float32's range bounds every one
        factor = " / temperature" if temperature != 1 else ""
        _require_within_range("logits are", torch.float32, f"max|logits|{factor}", largest / temperature,
                              of="the log-probs'")


def check_mask(name: str, mask: object, shape: tuple[int, ...], device: torch.device,
               check_values: bool = True, anchor: str = "hidden/logits") -> None:
    mask = _require_tensor(name, mask)
    if tuple(mask.shape) != shape:
        dims = {2: "[B, T]", 1: "[N]"}.get(len(shape), "hidden's leading dims")
        raise ValueError(f"{name} must have shape {dims}={list(shape)}, got {list(mask.shape)}")
    _require_device(name, mask, device, anchor)
    _require_constant(name, mask)
    if mask.dtype not in _MASK_DTYPES:
        raise TypeError(f"{name} must be a tensor of 0 and 1 in bool, int8-int64, uint8 or float (float32, "
                        f"bfloat16, float16, float64), got {mask.dtype}")
    if mask.dtype != torch.bool:
        if check_values and mask.numel() and not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError(f"{name} values must be 0 or 1")


def check_cu_seqlens(cu_seqlens: object, n_tokens: int, device: torch.device, check_values: bool = True,
                     anchor: str = "hidden") -> int:
    """Sequence boundaries of a packed batch: int [S + 1], 0 first, non-decreasing, n_tokens last. Returns S."""
    cu = _require_tensor("cu_seqlens", cu_seqlens)
    _require_integer("cu_seqlens", cu, "sequence offsets")
    cu = as_token_ids(cu)  # torch compares unsigned 16-64-bit tensors on no device: read as int64
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"cu_seqlens must be [S + 1] with S >= 1 sequences, got shape {list(cu.shape)}")
    _require_device("cu_seqlens", cu, device, anchor)
    if check_values and (int(cu[0]) != 0 or int(cu[-1]) != n_tokens or bool((cu[1:] < cu[:-1]).any())):
        raise ValueError(f"cu_seqlens must start at 0, never decrease and end at N={n_tokens} (hidden's rows), "
                         f"got {cu.tolist() if cu.numel() <= 16 else [int(cu[0]), '...', int(cu[-1])]}")
    return cu.numel() - 1


# The largest workspace a torch operator's int argument can carry (int64): past it the dispatcher refused the call
# inside the backend ("Expected a value of type 'int' ... but instead found type 'int'").
MAX_WORKSPACE_BYTES = 2**63 - 1


def check_workspace(workspace_bytes: object) -> int:
    """The GEMM path's logits workspace in bytes; None means the default (1 GiB)."""
    from .backends import DEFAULT_WORKSPACE_BYTES

    if workspace_bytes is None:
        return DEFAULT_WORKSPACE_BYTES
    count = integer_value(workspace_bytes)
    if count is None or not 0 < count <= MAX_WORKSPACE_BYTES:
        raise ValueError(f"workspace_bytes must be a positive int (bytes) of at most 2**63 - 1, got "
                         f"{shown(workspace_bytes)}")
    return count


def check_temperature(temperature: object) -> float:
    """A sampling temperature: a real number (not a bool, not text, not a tensor), finite and > 0, as
    GRPOLossConfig.temperature takes it."""
    real = finite_real(temperature)
    if real is None or real < MIN_TEMPERATURE:
        raise ValueError(f"temperature must be a finite number > 0 (at least {MIN_TEMPERATURE:g}: float32 logits "
                         f"divided by less overflow), got {shown(temperature)}")
    if real > MAX_TEMPERATURE:
        raise ValueError(f"temperature must be at most {MAX_TEMPERATURE:g} (float32 logits divided by more round to "
                         f"0: uniform samples, no gradient), got {shown(temperature)}")
    return real


def _check_per_token(name: str, value: object, shapes: tuple[tuple[int, ...], ...], device: torch.device,
                     expected: Optional[str] = None, anchor: str = "hidden/logits") -> torch.Tensor:
    """One of the objective's float inputs (advantages, log-probs, ratios) by its metadata: a dense float tensor of
    one of `shapes`, on `device`, asking no gradient. The padded and the packed form both check theirs here."""
    value = _require_tensor(name, value)
    if tuple(value.shape) not in shapes:
        expected = expected or "have shape " + " or ".join(str(list(s)) for s in shapes)
        raise ValueError(f"{name} must {expected}, got {list(value.shape)}")
    _require_float(name, value)
    _require_device(name, value, device, anchor)
    _require_constant(name, value)
    return value


def check_objective_inputs(logps: object, entropy: object, completion_mask: object, advantages: object,
                           config: object, old_logps: Optional[object], ref_logps: Optional[object],
                           importance_ratio: Optional[object], num_items_in_batch: Optional[object]
                           ) -> GRPOLossConfig:
    """`grpo_objective`'s inputs, called directly, by their metadata (its values are the caller's, as the API's
    are checked before its routes call it). Called directly it checked nothing: a mask or advantages of another
    shape failed in a broadcast inside torch, a dict config or a missing ref_logps with beta != 0 as an
    AttributeError naming neither. The config to compute with (None: the defaults, as the API takes it)."""
    config = check_config(config)
    lp = _require_tensor("logps", logps)
    _require_float("logps", lp)
    if lp.dim() != 2:
        raise ValueError(f"logps must be [B, T], got {list(lp.shape)}")
    (B, T), device = tuple(lp.shape), lp.device
    for name, value in (("entropy", entropy), ("completion_mask", completion_mask)):
        value = _require_tensor(name, value)
        if tuple(value.shape) != (B, T):
            raise ValueError(f"{name} must have logps' shape [B, T]={[B, T]}, got {list(value.shape)}")
        _require_device(name, value, device, "logps")
    _require_float("entropy", entropy)
    if completion_mask.dtype not in _MASK_DTYPES:
        raise TypeError(f"completion_mask must be a bool, integer or float tensor, got {completion_mask.dtype}")
    _check_per_token("advantages", advantages, ((B,), (B, 1), (B, T)), device, anchor="logps")
    for name, value in (("old_logps", old_logps), ("ref_logps", ref_logps), ("importance_ratio", importance_ratio)):
        if value is not None:
            _check_per_token(name, value, ((B, T), (B, 1)), device, anchor="logps")
    if config.beta != 0.0 and ref_logps is None:
        raise ValueError("config.beta != 0 needs ref_logps (the reference model's per-token log-probs)")
    if num_items_in_batch is not None:
        _check_num_items("num_items_in_batch", num_items_in_batch, check_values=False)
    return config


def check_packed_inputs(n_tokens: int, n_sequences: int, device: torch.device, advantages: object,
                        old_logps: Optional[object], ref_logps: Optional[object], importance_ratio: Optional[object],
                        names: ArgumentNames = LOSS_NAMES) -> None:
    """The packed form's inputs by their metadata, before they are laid out on the [S, T] grid (check_loss_inputs
    then reads their values there): per-token values [N], advantages [S] or [N]."""
    N, S = n_tokens, n_sequences
    for name, value in ((names.old_logps, old_logps), (names.ref_logps, ref_logps),
                        (names.importance_ratio, importance_ratio)):
        if value is not None:
            _check_per_token(name, value, ((N,),), device, f"be [N]=[{N}] in the packed form (one value per token)",
                             names.hidden)
    _check_per_token(names.advantages, advantages, ((S,), (N,)), device,
                     f"be [S]=[{S}] (one per sequence) or [N]=[{N}] in the packed form", names.hidden)


def trainer_advantages(advantages: object, batch: object) -> object:
    """Advantages as TRL's `_compute_loss` and Liger's chunked loss take them, in the forms the checks accept:
    [B, 1] (one per sequence as a column; TRL unsqueezes only a 1-d tensor and broadcasts it, and a GRPOTrainer
    subclass may hand either) as [B]; integer advantages (+1 / -1 rewards used as they are; torch's arithmetic makes
    the loss float) as float32. Both were refused before, while both trainers computed the loss. `batch`: the
    [B, T, ...] tensor whose leading dimension is B, None for the packed form (anything else, or another shape or
    dtype of advantages, is left for the checks to name)."""
    if not isinstance(advantages, torch.Tensor):
        return advantages
    if (isinstance(batch, torch.Tensor) and batch.dim() >= 2 and advantages.dim() == 2
            and tuple(advantages.shape) == (batch.shape[0], 1)):
        advantages = advantages[:, 0]
    if advantages.dtype in _INTEGER_DTYPES and _plain(advantages) and advantages.device.type != "meta":
        advantages = advantages.float()
    return advantages


def check_loss_inputs(
    batch_shape: tuple[int, int],
    device: torch.device,
    completion_mask: object,
    advantages: object,
    old_logps: Optional[object],
    ref_logps: Optional[object],
    importance_ratio: Optional[object],
    num_items_in_batch: Optional[object],
    config: GRPOLossConfig,
    check_values: bool = True,
    names: ArgumentNames = LOSS_NAMES,
) -> None:
    B, T = batch_shape
    check_mask(names.mask, completion_mask, (B, T), device, check_values, names.hidden)

    adv = _require_tensor(names.advantages, advantages)
    if tuple(adv.shape) not in ((B,), (B, T)):
        raise ValueError(f"{names.advantages} must have shape [B]=[{B}], [B, 1]=[{B}, 1] or [B, T]={[B, T]}, got "
                         f"{list(adv.shape)}")
    _check_per_token(names.advantages, adv, ((B,), (B, T)), device, anchor=names.hidden)
    if check_values:  # only where scored: a padded position's value (a NaN included) is never read
        scored = completion_mask != 0
        bad = ~torch.isfinite(adv) & (scored if adv.dim() == 2 else scored.any(-1))
        if bool(bad.any()):
            position = torch.nonzero(bad)[0].tolist()
            raise ValueError(f"{names.advantages} contains NaN or Inf values where {names.mask} is 1 (at position "
                             f"{position}: {float(adv[tuple(position)])})")

    for name, value, shapes in (
        (names.old_logps, old_logps, ((B, T),)),
        (names.ref_logps, ref_logps, ((B, T),)),
        (names.importance_ratio, importance_ratio, ((B, T), (B, 1))),
    ):
        if value is None:
            continue
        value = _check_per_token(name, value, shapes, device, anchor=names.hidden)
        if check_values:
            _require_finite_where_scored(name, value, completion_mask, names.mask,
                                         log_probabilities=name != names.importance_ratio)
    if check_values and importance_ratio is not None and bool((importance_ratio < 0).any()):
        raise ValueError(f"{names.importance_ratio} must be >= 0 (it is a probability ratio)")
    if (get_loss_type(config.loss_type).folds_importance_ratio and importance_ratio is not None
            and importance_ratio.shape[-1] == 1 and T > 1):
        # TRL: VESPO folds the engine's per-token log-ratios into its sequence weight; a sequence-level IS mode
        # has none to fold (it requires vllm_importance_sampling_mode 'token_truncate' or 'token_mask').
        raise ValueError(f"loss_type={config.loss_type!r} needs a per-token {names.importance_ratio} [B, T], got "
                         "[B, 1] (TRL requires vllm_importance_sampling_mode='token_truncate' or 'token_mask')")
    if config.beta != 0.0 and ref_logps is None:
        raise ValueError(f"config.beta != 0 needs {names.ref_logps} (the reference model's per-token log-probs)")
    if num_items_in_batch is not None:
        _check_num_items(names.num_items_in_batch, num_items_in_batch, check_values)


def _check_num_items(name: str, value: object, check_values: bool) -> None:
    """A count: a real number, or a one-element real tensor with values to read (a meta or complex one failed
    inside torch when read), asking no gradient."""
    if isinstance(value, torch.Tensor):
        if not torch.compiler.is_compiling():  # a wrapper subclass's value is not the number it shows
            _refuse_traced(name, value)
        _require_constant(name, value)
        bad = (value.numel() != 1 or value.dtype not in _COUNT_DTYPES
               or value.device.type == "meta" or value.layout != torch.strided)
        bad = bad or (check_values and not (bool(torch.isfinite(value.float()).all()) and float(value) >= 0))
    else:
        count = finite_real(value)
        bad = count is None or count < 0
    if bad:
        raise ValueError(f"{name} must be a non-negative finite scalar (a number or a one-element real tensor with "
                         f"values), got {shown(value)}")


def _require_finite_where_scored(name: str, value: torch.Tensor, mask: torch.Tensor, mask_name: str,
                                 log_probabilities: bool = False) -> None:
    """A NaN or an infinity at a padded position is whatever the caller had there and is never read (the objective
    selects it out); at a scored one it would make the loss non-finite (a sequence-level [B, 1] value is scored
    when its sequence has a token). `log_probabilities`: a scored value above LOG_PROB_SLACK is also said, in a
    warning (one host sync for both checks)."""
    scored = mask != 0
    if value.shape[-1] == 1 and scored.shape[-1] != 1:
        scored = scored.any(-1, keepdim=True)
    bad = ~torch.isfinite(value) & scored
    positive = (value > LOG_PROB_SLACK) & scored if log_probabilities else bad
    any_bad, any_positive = torch.stack([bad.any(), positive.any()]).tolist()
    if any_bad:
        position = torch.nonzero(bad)[0].tolist()
        raise ValueError(f"{name} is {float(value[tuple(position)])} at position {position}, where {mask_name} "
                         "is 1: a scored token needs a finite value (infinities are allowed only where the mask is 0)")
    if any_positive:
        position = torch.nonzero(positive)[0].tolist()
        warn_at_caller(f"{name} is {float(value[tuple(position)]):.6g} at position {position}, where {mask_name} is "
                       f"1: a log-probability is at most 0 (probabilities, or negative log-likelihoods, passed as "
                       f"log-probabilities?); the loss uses the values as given", LogProbValueWarning)


# How far above 0 a log-probability may come from rounding before it is said: a log-softmax in float32 lands within
# a few ulps of 0 (1e-6), in bfloat16 exactly at or below it; 1e-3 leaves room and still catches probabilities
# (at least 1e-3 where they matter) and negative log-likelihoods.
LOG_PROB_SLACK = 1e-3


class LogProbValueWarning(UserWarning):
    """old_logps or ref_logps above 0 at a scored token: not log-probabilities as given."""


def check_kept_token_ids(kept_token_ids: object, targets: torch.Tensor, vocab_size: int,
                         mask: Optional[torch.Tensor] = None, check_values: bool = True,
                         targets_name: str = "completion_ids") -> None:
    """kept_token_ids [*targets.shape, K] int64 ids in [-1, vocab_size), -1 padding; a position that carries a set
    holds each id once and its target among them (positions where `mask` is 0 are not checked for the target)."""
    if kept_token_ids is None:
        return
    kept = _require_tensor("kept_token_ids", kept_token_ids)
    shape = tuple(targets.shape)
    if kept.dtype not in (torch.int64, torch.int32) or kept.dim() != len(shape) + 1 or tuple(kept.shape[:-1]) != shape:
        raise ValueError(f"kept_token_ids must be an int64 tensor of shape {list(shape)} + [K] (the targets' shape "
                         f"and K kept ids per position, -1 padding), got {kept.dtype} {list(kept.shape)}")
    if kept.shape[-1] == 0:
        raise ValueError(f"kept_token_ids has K=0 ids per position (shape {list(kept.shape)}): a kept set holds at "
                         "least the sampled token; pass kept_token_ids=None to score over the whole vocabulary")
    _require_device("kept_token_ids", kept, targets.device)
    if not check_values or kept.numel() == 0:
        return
    low, high = int(kept.min()), int(kept.max())
    if low < -1 or high >= vocab_size:
        raise ValueError(f"kept_token_ids must hold token ids in [0, {vocab_size}) or -1 (padding), got values in "
                         f"[{low}, {high}]")
    flat = kept.reshape(-1, kept.shape[-1])
    has_set = (flat >= 0).any(-1)
    ordered = flat.sort(-1).values
    repeated = ((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)).any(-1)
    if bool(repeated.any()):
        position = _position(int(torch.nonzero(repeated)[0]), shape)
        raise ValueError(f"kept_token_ids holds a token id twice at position {position}; each set lists its ids once")
    missing = has_set & ~(flat == targets.reshape(-1, 1)).any(-1)
    if mask is not None:
        missing &= mask.reshape(-1) != 0
    if bool(missing.any()):
        index = int(torch.nonzero(missing)[0])
        raise ValueError(f"{targets_name}: the target token {int(targets.reshape(-1)[index])} at position "
                         f"{_position(index, shape)} is not in its kept_token_ids set: the sampler cannot have drawn it")


def _position(flat_index: int, shape: tuple[int, ...]) -> list[int]:
    position = []
    for size in reversed(shape):
        position.append(flat_index % size)
        flat_index //= size
    return position[::-1]


_DEFAULT_CONFIG = GRPOLossConfig()  # frozen; its loss_params ({}) is never written to
