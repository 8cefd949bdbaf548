"""A backend registered from outside the package, after grpo_kernels is imported, as a user's plugin would: the
torch backend's streaming passes behind a module of its own, counting the calls that reach it.

`registered()` adds it for one test; `-p plugin_backend` (a pytest plugin: `pytest_configure` registers it) adds
it before collection, so that the registry-parametrized tests run it too.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from grpo_kernels.backends import BACKENDS, BackendSpec, register_backend

NAME = "plugin_chunked"
calls = {"forward": 0, "backward": 0}


class PluginBackend:
    """The Protocol (grpo_kernels/backends/protocol.py): the torch backend's passes, each call counted."""

    def __init__(self, workspace_bytes: int) -> None:
        from grpo_kernels.backends import torch_streaming

        self._streaming = torch_streaming

    def linear_forward(self, hidden, head, targets):
        calls["forward"] += 1
        return self._streaming.linear_forward(hidden, head, targets)

    def linear_backward(self, *args, **kwargs):
        calls["backward"] += 1
        return self._streaming.linear_backward(*args, **kwargs)


def backend(workspace_bytes: int) -> PluginBackend:
    return PluginBackend(workspace_bytes)


SPEC = BackendSpec(NAME, __name__, "the torch streaming passes, counted (a test plugin)")


def register() -> None:
    if NAME not in BACKENDS:
        register_backend(SPEC)


def unregister() -> None:
    from grpo_kernels import routing

    BACKENDS.pop(NAME, None)
    routing._cached_route.cache_clear()


@contextlib.contextmanager
def registered() -> Iterator[str]:
    """The backend registered (calls counted from 0) for the block; its name."""
    calls.update(forward=0, backward=0)
    register()
    try:
        yield NAME
    finally:
        unregister()


def pytest_configure(config) -> None:
    register()
