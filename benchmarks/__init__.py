"""Side-by-side speed and peak-memory benchmarks of every way to compute the GRPO loss.

Run with `pytest benchmarks/suite/ --benchmark-only` (add `--benchmark-json=FILE`), then turn the JSON into
tables and plots with `python -m benchmarks.suite.report FILE`. `python -m benchmarks.suite.run` does both and
names the files after the device. See docs/benchmarks.md.
"""
