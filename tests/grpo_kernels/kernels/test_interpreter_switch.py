"""TRITON_INTERPRET is read as Triton reads it: with TRITON_INTERPRET=true Triton interpreted while the launcher,
reading only "1", refused CPU tensors ("triton was already imported without it")."""

from __future__ import annotations

import pytest

from grpo_kernels.kernels.launch import interpreting

knobs = pytest.importorskip("triton.knobs")


@pytest.mark.parametrize("value", ["1", "true", "True", "TRUE", "yes", "on", "ON", "0", "false", "off", "no", "2",
                                   "", " 1", "on ", "interpret"])
def test_the_launcher_reads_triton_interpret_as_triton_does(value, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert interpreting() == knobs.getenv_bool("TRITON_INTERPRET", False), value
