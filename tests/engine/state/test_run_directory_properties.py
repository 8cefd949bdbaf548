"""Property tests of a run directory's files as a kill, a full disk or a user can leave them: metrics and samples
histories cut off, corrupted or gone, checkpoints with files missing or damaged. Each is read back whole and in
step order, or refused with a message naming the file (and line); never a traceback from inside, never a line
silently lost."""

import json
import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_engine.state.checkpoint import MANIFEST_FILE, STATE_FILE, checkpoint_problems, write_manifest
from grpo_engine.state.metrics import HISTORY_DIR, METRICS_FILE, read_metrics, restore_history

DERANDOMIZE = bool(os.environ.get("CI"))
SETTINGS = settings(max_examples=60, deadline=None, derandomize=DERANDOMIZE,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def line(step: int, extra: int) -> str:
    return json.dumps({"step": step, "reward": extra / 7})


@st.composite
def histories(draw):
    """(lines as the run wrote them, the checkpoint step, damage to the file, whether the checkpoint has a copy)."""
    steps = draw(st.integers(1, 6))
    lines = [line(step, draw(st.integers(0, 50))) for step in range(1, steps + 1)
             for _ in range(draw(st.integers(1, 2)))]
    return (lines, draw(st.integers(1, steps)),
            draw(st.sampled_from(["none", "cut_last", "corrupt_middle", "deleted", "emptied", "garbage_last"])),
            draw(st.booleans()), draw(st.integers(1, 10_000)))


@SETTINGS
@given(histories())
def test_a_resumed_history_is_whole_or_refused_naming_the_line(tmp_path_factory, case):
    lines, step, damage, has_copy, seed = case
    run_dir = tmp_path_factory.mktemp("run")
    checkpoint = run_dir / "checkpoint"
    text = "".join(f"{x}\n" for x in lines)
    if has_copy:
        (checkpoint / HISTORY_DIR).mkdir(parents=True)
        upto = [x for x in lines if json.loads(x)["step"] <= step]
        (checkpoint / HISTORY_DIR / METRICS_FILE).write_text("".join(f"{x}\n" for x in upto))
    path = run_dir / METRICS_FILE
    cut = seed % max(1, len(lines[-1]) - 1) + 1
    damaged = {"none": text, "cut_last": text[: len(text) - 1 - cut], "deleted": None, "emptied": "",
               "garbage_last": text + "\x00\x01not json\n",
               "corrupt_middle": text.replace(lines[0], lines[0][: len(lines[0]) // 2], 1) if len(lines) > 1 else text,
               }[damage]
    if damaged is not None:
        path.write_text(damaged)
    corrupt_inside = damage == "corrupt_middle" and len(lines) > 1
    try:
        restore_history(path, step, checkpoint if has_copy else None)
    except ValueError as exc:
        assert corrupt_inside, exc
        assert f"{path}: line 1 is not a JSON object" in str(exc)
        return
    assert not corrupt_inside or lines[0] == lines[0][: len(lines[0]) // 2]
    restored = path.read_text().splitlines()
    rows = [json.loads(x) for x in restored]  # every line whole
    assert [r["step"] for r in rows] == sorted(r["step"] for r in rows) and all(r["step"] <= step for r in rows)
    wanted = [x for x in lines if json.loads(x)["step"] <= step]
    if has_copy:  # the checkpoint implies its history: nothing up to its step is lost, whatever the damage
        assert restored == wanted
    elif damage in ("none", "garbage_last"):
        assert restored == wanted
    else:  # no copy (an older checkpoint): what the file still holds, whole
        assert all(x in wanted for x in restored)
    replaced = run_dir / f"{METRICS_FILE}.replaced-at-step-{step:06d}"
    if damaged is not None and damaged != "".join(f"{x}\n" for x in restored):
        assert replaced.read_text() == damaged  # what the file held is kept beside it
    assert read_metrics(run_dir) == rows


@st.composite
def damaged_checkpoints(draw):
    files = {"model/model.safetensors": 64, "optimizer.pt": 32, "scheduler.pt": 8, "rng-0.pt": 16}
    damage = draw(st.dictionaries(st.sampled_from(sorted(files) + [STATE_FILE, MANIFEST_FILE]),
                                  st.sampled_from(["missing", "truncated", "flipped", "not_json", "json_list"]),
                                  max_size=3))
    return files, damage


@SETTINGS
@given(damaged_checkpoints())
def test_every_damaged_checkpoint_file_is_named(tmp_path_factory, case):
    files, damage = case
    path = tmp_path_factory.mktemp("checkpoint")
    for name, size in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(bytes(range(size)))
    (path / STATE_FILE).write_text(json.dumps({"step": 3, "sampler": {"epoch": 0, "offset": 0}}))
    write_manifest(path)
    for name, how in damage.items():
        file = path / name
        if how == "missing":
            file.unlink()
        elif how == "truncated":
            file.write_bytes(file.read_bytes()[:-1])
        elif how == "flipped":
            data = bytearray(file.read_bytes())
            data[0] ^= 0xFF
            file.write_bytes(bytes(data))
        else:
            file.write_text("{not json" if how == "not_json" else "[1, 2]")
    problems = checkpoint_problems(path)
    if not damage:  # intact, but the weights file is bytes, not safetensors: named too
        assert len(problems) == 1 and problems[0].startswith("model/model.safetensors cannot be read as safetensors (")
        return
    assert problems, damage
    text = " | ".join(problems)
    if MANIFEST_FILE in damage:
        assert MANIFEST_FILE in text  # the files cannot be verified: said so
    for name, how in damage.items():
        if name == MANIFEST_FILE:
            continue
        if name == STATE_FILE and how in ("not_json", "missing", "truncated", "flipped"):
            assert STATE_FILE in text
        elif MANIFEST_FILE not in damage:
            assert name in text, (name, how, problems)
