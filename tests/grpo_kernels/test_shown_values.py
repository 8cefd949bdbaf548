"""grpo_kernels/messages.py: a caller's value quoted in an error message on one short line."""

import numpy as np
import torch

from grpo_kernels.messages import SHOWN_CHARACTERS, shown


def test_arrays_of_many_elements_by_dtype_and_shape():
    assert shown(torch.zeros(1000, 3)) == "Tensor of dtype float32 and shape [1000, 3]"
    assert shown(torch.zeros(0, dtype=torch.int64)) == "Tensor of dtype int64 and shape [0]"
    assert shown(np.zeros((2, 5))) == "ndarray of dtype float64 and shape [2, 5]"


def test_a_single_element_and_scalars_by_their_repr():
    assert shown(torch.tensor(float("nan"))) == "tensor(nan)"
    assert shown(float("inf")) == "inf" and shown("auto") == "'auto'" and shown(None) == "None"


def test_long_or_multi_line_reprs_fold_onto_one_cut_line():
    text = shown("x" * 500)
    assert len(text) == SHOWN_CHARACTERS and text.endswith("...")
    assert "\n" not in shown({"a": "line\nbreak"}) and "\n" not in shown(torch.zeros(1, 1, 1).numpy())


def test_a_failing_repr_is_named_by_its_type():
    class Hostile:
        def __repr__(self):
            raise RuntimeError("no")

    assert shown(Hostile()) == "<Hostile>"
