"""FusedLinearGRPOLoss's process_group: anything but a ProcessGroup (or None) is refused when given, by one line
naming it, and a module holding a group is deep-copied (sharing the group) and refuses pickling by name.

Before: a string, a number or a DeviceMesh was taken by the constructor and by the attribute, and refused only at the
first forward; a deep copy of a module holding a group (a reference model that contains the loss) and torch.save
both failed as "cannot pickle 'torch._C._distributed_c10d.ProcessGroup' object".
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from process_groups import world_of_one  # noqa: F401  (a fixture)

from grpo_kernels import FusedLinearGRPOLoss

NOT_GROUPS = st.one_of(st.text(max_size=4), st.integers(), st.floats(allow_nan=False), st.booleans(),
                       st.lists(st.integers(), max_size=2), st.just(object()), st.just(torch.zeros(1)))


@settings(max_examples=25, deadline=None)
@given(value=NOT_GROUPS)
def test_a_process_group_that_is_not_one_is_refused_when_given(value):
    with pytest.raises(TypeError) as caught:
        FusedLinearGRPOLoss(process_group=value)
    assert str(caught.value).startswith("process_group must be a torch.distributed ProcessGroup")
    module = FusedLinearGRPOLoss(beta=0.1)
    with pytest.raises(TypeError, match=r"^process_group must be a torch.distributed ProcessGroup"):
        module.process_group = value
    assert module.process_group is None and module.beta == 0.1  # the refused value left the module as it was


def _inputs():
    g = torch.Generator().manual_seed(0)
    B, T, H, V = 2, 3, 8, 11
    return (torch.randn(B, T, H, generator=g), torch.randn(V, H, generator=g), torch.randint(0, V, (B, T), generator=g),
            torch.ones(B, T), torch.randn(B, generator=g))


def test_a_module_holding_a_group_is_deep_copied_sharing_it_and_refuses_pickling(world_of_one):
    module = FusedLinearGRPOLoss(beta=0.0, backend="torch", process_group=world_of_one)
    duplicate = copy.deepcopy(module)
    assert duplicate.process_group is world_of_one and duplicate.config == module.config
    torch.testing.assert_close(duplicate(*_inputs())[0], module(*_inputs())[0], atol=0, rtol=0)
    with pytest.raises(TypeError, match=r"^FusedLinearGRPOLoss with a process_group cannot be pickled \(torch.save\)"):
        torch.save(module, io.BytesIO())
    module.process_group = None
    torch.save(module, io.BytesIO())


def test_a_device_mesh_is_refused_with_its_group_named(world_of_one):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    with pytest.raises(TypeError, match=r"mesh.get_group\(\)\), got DeviceMesh$"):
        FusedLinearGRPOLoss(process_group=mesh)
    FusedLinearGRPOLoss(process_group=mesh.get_group())
