"""A run directory's log holding its lines more than once, or out of order (two copies of metrics.jsonl
concatenated, a sync tool appending the file again, lines sorted by hand) rebuilds on resume to each line once, in
step order: the checkpoint's copy, plus the lines up to its step that only the file holds (an evaluation logged after
the save). Before, such a line was kept as often as the file held it: steps [.., 3, 3, 3, 4, ..] after a resume."""

from __future__ import annotations

import json
import random

from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.state.metrics import HISTORY_DIR, METRICS_FILE, read_metrics, restore_history


def _line(step: int, kind: str) -> str:
    return json.dumps({"step": step, kind: step / 7})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.integers(1, 6), copies=st.integers(1, 3), shuffle=st.booleans(), seed=st.integers(0, 2**16),
       later=st.integers(0, 3))
def test_a_log_holding_its_lines_repeatedly_or_out_of_order_rebuilds_to_each_once(steps, copies, shuffle, seed,
                                                                                   later, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    saved = [_line(step, "reward") for step in range(steps + 1)]  # the checkpoint's copy, saved at `steps`
    after_save = _line(steps, "eval_accuracy")  # logged after the save
    beyond = [_line(steps + 1 + k, "reward") for k in range(later)]  # steps the resumed run writes again
    held = (saved + [after_save] + beyond) * copies
    if shuffle:
        random.Random(seed).shuffle(held)
    (run_dir / "checkpoint" / HISTORY_DIR).mkdir(parents=True)
    (run_dir / "checkpoint" / HISTORY_DIR / METRICS_FILE).write_text("".join(f"{x}\n" for x in saved))
    (run_dir / METRICS_FILE).write_text("".join(f"{x}\n" for x in held))
    restore_history(run_dir / METRICS_FILE, steps, run_dir / "checkpoint")
    assert (run_dir / METRICS_FILE).read_text().splitlines() == saved + [after_save]
    assert [row["step"] for row in read_metrics(run_dir)] == [*range(steps + 1), steps]
