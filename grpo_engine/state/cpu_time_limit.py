"""The CPU time this process may use (ulimit -t, RLIMIT_CPU), made to warn before it ends the run.

Batch schedulers and shared machines cap a job's CPU seconds. Past the soft limit the kernel sends SIGXCPU (which
ended the process at once by default), past the hard limit SIGKILL; `ulimit -t N` sets both to N, so the run was
killed outright, every step since the last checkpoint lost, without a line (measured: 4 of 4 runs under a limit).
While training, the soft limit is set a margin below the hard one: SIGXCPU comes first, and training stops on it
at the step boundary with a checkpoint (interrupt.stop_signals), in the margin's CPU seconds. The soft limit is put
back when training ends.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator, Optional

from ..resource_limits import limits

# The share of the hard limit kept for finishing the step and saving, and its least (a step of all of a machine's
# threads spends CPU seconds many times faster than wall seconds).
MARGIN_SHARE = 0.1
MIN_MARGIN_S = 1


def warning_soft_limit(soft: Optional[int], hard: Optional[int], used_s: float) -> Optional[int]:
    """The soft limit (CPU seconds; None: unlimited) that warns with SIGXCPU a margin before the hard one, or None to
    keep `soft` (already below it, or no hard limit). Never below the next whole second of `used_s`: a limit already
    passed would not warn."""
    if hard is None:
        return None
    target = max(hard - max(MIN_MARGIN_S, math.ceil(hard * MARGIN_SHARE)), math.ceil(used_s) + 1)
    return target if target < hard and (soft is None or target < soft) else None


@contextmanager
def warned_before_the_cpu_limit() -> Iterator[None]:
    """For the body: a finite hard RLIMIT_CPU is preceded by a soft one that sends SIGXCPU in time to save."""
    pair = limits("RLIMIT_CPU")
    lowered = None
    if pair is not None and pair[1] is not None:
        import resource  # there: limits() read it

        usage = resource.getrusage(resource.RUSAGE_SELF)
        lowered = warning_soft_limit(*pair, usage.ru_utime + usage.ru_stime)
        if lowered is not None:
            try:
                previous = resource.getrlimit(resource.RLIMIT_CPU)
                resource.setrlimit(resource.RLIMIT_CPU, (lowered, previous[1]))
            except (OSError, ValueError):
                lowered = None
    try:
        yield
    finally:
        if lowered is not None:
            try:
                resource.setrlimit(resource.RLIMIT_CPU, previous)
            except (OSError, ValueError):
                pass
