"""torchrun's target for a launch whose processes start from different things, as the hosts of a multi-node launch
may: each process works in its own directory, `<first argument>/r<RANK>` (its own data file, model directory and
reward module at the same relative paths, the module importable), and an argument `{a|b}` is a for process 0 and b
for process 1. The rest is `grpo-engine`'s command line."""

import os
import re
import runpy
import sys

rank = int(os.environ["RANK"])
own = os.path.join(sys.argv[1], f"r{rank}")
os.chdir(own)
sys.path.insert(0, own)
sys.argv = [sys.argv[0]] + [re.sub(r"\{([^{}|]*)\|([^{}|]*)\}", lambda m: m.group(1 + rank), a) for a in sys.argv[2:]]
runpy.run_module("grpo_engine", run_name="__main__", alter_sys=True)
