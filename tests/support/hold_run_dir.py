"""Holds a run directory the way a training run does, until killed: `python hold_run_dir.py RUN_DIR`.
Prints "held" once it holds it."""

import sys
import time

from grpo_engine.state.run_lock import RunLock

if __name__ == "__main__":
    RunLock.acquire(sys.argv[1])
    print("held", flush=True)
    time.sleep(600)
