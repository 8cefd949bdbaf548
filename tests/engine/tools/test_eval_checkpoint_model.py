"""`grpo-engine eval --model` naming a checkpoint: its model/ is verified against the checkpoint's manifest before
any weight loads (before, a weight file damaged since the save was evaluated as it was, and its scores reported as
the checkpoint's); and a checkpoint or a run directory named where the model directory goes is told where its model
is (before: "not a Hugging Face model directory (save one with model.save_pretrained)", advice for another
mistake)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.cli import main
from grpo_engine.model.loading import ModelLoadError, check_model_dir
from grpo_engine.state import checkpoint as ckpt
from grpo_engine.tools import evaluate


class WeightsLoading(Exception):
    pass


def _checkpoint(tiny_model_dir: Path, directory: Path, step: int = 3) -> Path:
    """A checkpoint as the engine saves one, as far as eval reads it: model/, trainer state, optimizer, manifest."""
    shutil.copytree(tiny_model_dir, directory / "model")
    (directory / ckpt.STATE_FILE).write_text(json.dumps({"step": step, "sampler": {"epoch": 0, "offset": 0}}))
    (directory / "optimizer.pt").write_bytes(b"AdamW's state")
    ckpt.write_manifest(directory)
    return directory


def _flip(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0x01
    file.write_bytes(bytes(data))


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[:-7])


DAMAGE = {"flipped byte": (_flip, "is corrupted"), "truncated": (_truncate, "is truncated or overwritten")}


def _eval(model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> tuple[str, list[str]]:
    def loading(*args, **kwargs):
        raise WeightsLoading

    monkeypatch.setattr(evaluate, "load_eval_model", loading)
    try:
        outcome = main(["eval", "--model", str(model), "--data.builtin_max_operand", "2",
                        "--rollout.max_new_tokens", "4"])
    except WeightsLoading:
        outcome = "loading"
    return outcome, capsys.readouterr().err.splitlines()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damage=st.sampled_from(sorted(DAMAGE) + ["added", "none", "outside model/"]), data=st.data())
def test_eval_verifies_a_checkpoints_model_before_loading(damage, data, tiny_model_dir, tmp_path_factory,
                                                          monkeypatch, capsys):
    checkpoint = _checkpoint(tiny_model_dir, tmp_path_factory.mktemp("run") / "checkpoint-000003")
    files = sorted(str(p.relative_to(checkpoint)) for p in (checkpoint / "model").iterdir())
    name = data.draw(st.sampled_from(files))
    if damage in DAMAGE:
        DAMAGE[damage][0](checkpoint / name)
        problem = f"{name} {DAMAGE[damage][1]}"
    elif damage == "added":
        name = "model/pytorch_model.bin"
        (checkpoint / name).write_bytes(b"weights from elsewhere")
        problem = f"{name} is not among the files {ckpt.MANIFEST_FILE} verifies"
    elif damage == "outside model/":
        _flip(checkpoint / "optimizer.pt")  # not read by eval: no reason to refuse
        problem = None
    else:
        problem = None
    outcome, lines = _eval(checkpoint / "model", monkeypatch, capsys)
    if problem is None:
        assert outcome == "loading", lines
        return
    assert outcome != "loading" and len(lines) == 1, (outcome, lines)
    assert f"is checkpoint checkpoint-000003's and does not match its {ckpt.MANIFEST_FILE}: {problem}" in lines[0]


def test_a_checkpoint_named_as_a_model_is_told_its_model(tiny_model_dir, tmp_path):
    checkpoint = _checkpoint(tiny_model_dir, tmp_path / "checkpoint-000003")
    with pytest.raises(ModelLoadError, match=f"it is a checkpoint, whose model is {str(checkpoint / 'model')!r}"):
        check_model_dir(str(checkpoint))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.integers(0, 10**6), min_size=1, max_size=3, unique=True))
def test_a_run_directory_named_as_a_model_is_told_its_newest_model(steps, tiny_model_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    for step in steps:
        _checkpoint(tiny_model_dir, run_dir / "checkpoints" / f"checkpoint-{step:06d}", step)
    newest = run_dir / "checkpoints" / f"checkpoint-{max(steps):06d}"
    with pytest.raises(ModelLoadError, match=f"it is a run directory \\(its newest checkpoint: {newest.name}\\), "
                                             f"whose model is {str(newest / 'model')!r}"):
        check_model_dir(str(run_dir))
