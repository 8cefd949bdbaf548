"""Every dtype torch has, at every tensor argument of the loss, the log-probs and the loss from logits: each is
either taken with the answer of the same call in the argument's usual dtype, or refused before any work by one
TypeError / ValueError line from the boundary naming the argument. torch's integer-like dtypes without kernels
(int1..int7, uint1..uint7, bits8...) and its float8 / float4 formats failed inside a copy or a comparison with
NotImplementedError."""

from __future__ import annotations

import traceback
import warnings
from pathlib import Path

import pytest
import torch

import grpo_kernels
from grpo_kernels import fused_linear_grpo_loss, grpo_loss_from_logits, linear_logprobs

BOUNDARY = {"validation.py", "api.py", "module.py"}
ALL_DTYPES = sorted({value for value in vars(torch).values() if isinstance(value, torch.dtype)}, key=str)
B, T, H, V = 2, 3, 4, 7


def _inputs() -> dict:
    gen = torch.Generator().manual_seed(0)
    mask, ids = torch.tensor([[1, 1, 0], [1, 0, 1]]), torch.randint(0, V, (B, T), generator=gen)
    return dict(hidden=torch.randn(B, T, H, generator=gen), weight=torch.randn(V, H, generator=gen),
                bias=torch.randn(V, generator=gen), completion_ids=ids,
                completion_mask=mask, advantages=torch.randn(B, generator=gen),
                ref_logps=-torch.rand(B, T, generator=gen), num_items_in_batch=torch.tensor(4),
                cu_seqlens=torch.tensor([0, 2, 5]), logits=torch.randn(B, T, V, generator=gen),
                kept_token_ids=torch.stack([ids, torch.full_like(ids, -1)], -1))


def _calls(x: dict) -> dict:
    """entry -> ({input: the name the entry gives it}, call(x, backend))."""
    loss = lambda x, backend: fused_linear_grpo_loss(  # noqa: E731
        x["hidden"], x["weight"], x["completion_ids"], x["completion_mask"], x["advantages"], bias=x["bias"],
        ref_logps=x["ref_logps"], num_items_in_batch=x["num_items_in_batch"],
        config=grpo_kernels.GRPOLossConfig(beta=0.04), backend=backend).loss
    packed = lambda x, backend: fused_linear_grpo_loss(  # noqa: E731
        x["hidden"].reshape(-1, H)[:5], x["weight"], x["completion_ids"].reshape(-1)[:5], None, x["advantages"],
        cu_seqlens=x["cu_seqlens"], backend=backend).loss
    logprobs = lambda x, backend: linear_logprobs(  # noqa: E731
        x["hidden"], x["weight"], x["completion_ids"], mask=x["completion_mask"], backend=backend)
    kept = lambda x, backend: linear_logprobs(  # noqa: E731
        x["hidden"], x["weight"], x["completion_ids"], kept_token_ids=x["kept_token_ids"], backend=backend)
    logits = lambda x, backend: grpo_loss_from_logits(  # noqa: E731
        x["logits"], x["completion_ids"], x["completion_mask"], x["advantages"], backend=backend).loss
    same = lambda *names: {name: name for name in names}  # noqa: E731
    return {"loss": (same("hidden", "weight", "bias", "completion_ids", "completion_mask", "advantages", "ref_logps",
                          "num_items_in_batch"), loss),
            "packed": (same("cu_seqlens"), packed),
            "logprobs": ({"completion_ids": "targets", "completion_mask": "mask"}, logprobs),
            "kept": (same("kept_token_ids"), kept), "logits": (same("logits"), logits)}


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x's values in `dtype` where torch converts to it, else an empty tensor of its shape (a dtype with no copy
    kernel still reaches a caller that way, e.g. from a file or a custom kernel)."""
    try:
        return x.to(dtype)
    except (RuntimeError, TypeError, NotImplementedError):
        return torch.empty(x.shape, dtype=dtype)


CASES = [(entry, argument) for entry, (arguments, _) in _calls(_inputs()).items() for argument in arguments]


@pytest.mark.parametrize("backend", ["reference", "gemm"])
@pytest.mark.parametrize("entry,argument", CASES)
def test_any_dtype_of_any_argument_gives_the_answer_or_one_line_naming_it(entry, argument, backend):
    x = _inputs()
    names, call = _calls(x)[entry]
    expected = call(x, backend)
    for dtype in ALL_DTYPES:
        bad = dict(x, **{argument: _as(x[argument], dtype)})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                got = call(bad, backend)
            except (TypeError, ValueError) as exc:
                origin = Path(traceback.extract_tb(exc.__traceback__)[-1].filename)
                message = str(exc)
                assert origin.name in BOUNDARY and origin.parent == Path(grpo_kernels.__file__).parent, \
                    (dtype, origin, message)
                assert "\n" not in message and names[argument] in message, (dtype, message)
                continue
            except Exception as exc:  # noqa: BLE001: anything else is the failure this test is about
                pytest.fail(f"{argument} of {dtype}: {type(exc).__name__} from "
                            f"{traceback.extract_tb(exc.__traceback__)[-1].filename}: {exc}")
        # taken: the same answer as in its usual dtype, as far as the dtype holds the values
        same_values = torch.equal(_as(x[argument], dtype).to(x[argument].dtype), x[argument]) if \
            dtype.is_floating_point or not x[argument].dtype.is_floating_point else False
        if same_values:
            tolerance = dict(rtol=1e-2, atol=1e-2) if dtype.itemsize < 4 or x[argument].dtype.itemsize < 4 else {}
            torch.testing.assert_close(got.double(), expected.double(), **tolerance, msg=f"{argument} of {dtype}")
