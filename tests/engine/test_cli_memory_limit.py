"""An address-space limit (ulimit -v, RLIMIT_AS) too small for torch: one line saying so and what to raise, exit
status 1, before anything loads. Before, torch's import stopped, depending on the limit, with a MemoryError traceback
of some fifty lines through importlib, an ImportError "failed to map segment from shared object", or OpenBLAS's
four lines about threads followed by "interrupted"."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

from grpo_engine.address_space import is_out_of_memory
from hypothesis import HealthCheck, given, settings, strategies as st

ROOT = Path(__file__).parents[2]
MiB = 2**20


def _limited(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return apply


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(limit_mib=st.integers(150, 1023), command=st.sampled_from(["train", "eval"]))
def test_an_address_space_too_small_is_one_line_naming_the_limit(limit_mib, command, tmp_path):
    args = {"train": ["train", "--output-dir", str(tmp_path / "run"), "--run.max_steps", "1"],
            "eval": ["eval", "--model", str(tmp_path)]}[command]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-m", "grpo_engine", *args], env=env, capture_output=True, text=True,
                            timeout=120, preexec_fn=_limited(limit_mib * MiB), stdin=subprocess.DEVNULL)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "address space" in lines[0] and "ulimit -v" in lines[0] and f"{limit_mib / 1024:.2f} GiB" in lines[0], lines[0]
    assert not (tmp_path / "run").exists()


@given(text=st.sampled_from(["libtorch_cpu.so: failed to map segment from shared object",
                             "libc10.so: cannot allocate memory", "libgomp.so: Cannot map zero-fill pages"]),
       before=st.text(max_size=20))
def test_a_library_that_could_not_be_mapped_is_out_of_memory_not_a_broken_install(text, before):
    assert is_out_of_memory(ImportError(before + text)) and is_out_of_memory(MemoryError())
    assert not is_out_of_memory(ImportError("No module named 'peft'"))
