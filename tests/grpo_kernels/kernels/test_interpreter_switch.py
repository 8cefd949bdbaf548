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


def test_a_value_triton_reads_as_off_is_named_when_cpu_tensors_need_the_interpreter():
    """Triton imported with TRITON_INTERPRET=2 (read as off) and a Triton backend on CPU tensors: the refusal says
    which value was read, and names no single backend (each Triton backend gives it)."""
    import os
    import subprocess
    import sys

    from repo_paths import ROOT

    script = ("import triton, torch\nfrom grpo_kernels import linear_logprobs\n"
              "linear_logprobs(torch.randn(2, 8), torch.randn(5, 8), torch.zeros(2, dtype=torch.long), "
              "backend='triton_tma')\n")
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TRITON_INTERPRET": "2", "PYTHONPATH": str(ROOT)})
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode != 0 and last.startswith("RuntimeError: the Triton backends on CPU tensors need the Triton "
                                                   "interpreter"), run.stderr[-2000:]
    assert "(TRITON_INTERPRET='2', which Triton reads as off: it takes 1, true, yes, on)" in last, last
