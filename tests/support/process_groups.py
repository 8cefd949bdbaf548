"""A process group of one, in the test's own process."""

from __future__ import annotations

import pytest


@pytest.fixture()
def world_of_one(tmp_path):
    """A 1-process gloo group (unless one is already up), for DTensors on a CPU mesh and process_group= arguments;
    taken down after the test, so later tests see torch.distributed as they expect."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    initialised_here = not dist.is_initialized()
    if initialised_here:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield dist.group.WORLD
    if initialised_here:
        dist.destroy_process_group()
