"""What `grpo-engine eval --output FILE` may write over: no file, an empty one, or an earlier evaluation's metrics.

Anything else there is a file the user keeps (notes, a config, another tool's results, the `--config` file itself):
before, it was replaced by the metrics without a word. Imports no torch: checked before the evaluation starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The key every evaluation's metrics hold (tools/evaluate.py evaluate_prompts): how an earlier output is known.
EVAL_METRIC_KEYS = ("accuracy",)
# An evaluation's JSON is a few hundred bytes (one mean per reward function): a larger file is not one.
EVAL_OUTPUT_BYTES = 1 << 20


class EvalOutputError(ValueError):
    """`eval --output` names a file that is not an earlier evaluation's output."""


def is_eval_metrics(value: Any) -> bool:
    return isinstance(value, dict) and all(key in value for key in EVAL_METRIC_KEYS)


def _earlier_metrics(path: Path) -> bool:
    if path.stat().st_size > EVAL_OUTPUT_BYTES:
        return False
    try:
        return is_eval_metrics(json.loads(path.read_bytes().decode("utf-8")))
    except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested past what the reader takes
        return False


def check_eval_output_replaceable(output: str | Path, key: str = "--output") -> None:
    """One line when `output` is a regular file that holds something other than an earlier evaluation's metrics
    (empty is nothing to lose). A directory or a special file is refused by check_output_file first."""
    path = Path(output)
    if not path.is_file() or path.stat().st_size == 0 or _earlier_metrics(path):
        return
    raise EvalOutputError(f"{key} {str(output)!r} exists and is not an earlier evaluation's metrics (a JSON object "
                          f"with {' and '.join(EVAL_METRIC_KEYS)}): name a new file, or move that one away first")
