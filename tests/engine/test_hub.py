"""Models and datasets by Hub id, offline: the tests write tiny repositories into a Hub cache of their own
(huggingface_hub's layout: models--ORG--NAME/snapshots/<commit>/..., refs/<branch>) and run with HF_HUB_OFFLINE=1,
as a user whose cache already holds them; nothing is downloaded."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_engine.data.prompts import load_prompt_rows
from grpo_engine.hub import HubError, load_hub_dataset, resolve_model
from grpo_engine.steps.rewards import reference_answer

ROOT = Path(__file__).parents[2]
GSM8K_README = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train.jsonl
  - split: test
    path: main/test.jsonl
---
"""
GSM8K_ROWS = {"train": [{"question": "1+1=", "answer": "One and one.\n#### 2"},
                        {"question": "2+1=", "answer": "Two and one.\n#### 3"}],
              "test": [{"question": "2+2=", "answer": "Two and two.\n#### 4"}]}
MATH_ROWS = [{"problem": "1+2=", "solution": "It is $\\boxed{3}$."}, {"problem": "0+0=", "solution": "$\\boxed{0}$"}]


def write_hub_repo(cache: Path, repo_type: str, repo_id: str, files: dict[str, str | Path],
                   branch: str = "main") -> Path:
    """A repository as huggingface_hub caches it: the files in snapshots/<commit>/, the branch naming the commit."""
    org, name = repo_id.split("/")
    folder = cache / f"{repo_type}s--{org}--{name}"
    commit = hashlib.sha1(f"{repo_id}@{branch}".encode()).hexdigest()
    snapshot = folder / "snapshots" / commit
    for relative, content in files.items():
        target = snapshot / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copyfile(content, target)
        else:
            target.write_text(content)
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / branch).write_text(commit)
    return snapshot


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


@pytest.fixture()
def offline_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hub cache, read offline (huggingface_hub reads both settings when it is called)."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def model_files(model_dir: Path) -> dict[str, Path]:
    return {p.name: p for p in model_dir.iterdir() if p.is_file()}


def test_a_model_id_resolves_to_its_snapshot_and_a_directory_stays_itself(offline_cache, tiny_model_dir):
    main = write_hub_repo(offline_cache, "model", "tiny-org/tiny-model", model_files(tiny_model_dir))
    tagged = write_hub_repo(offline_cache, "model", "tiny-org/tiny-model", model_files(tiny_model_dir), branch="v1")
    assert Path(resolve_model("tiny-org/tiny-model")) == main.resolve()
    assert Path(resolve_model("tiny-org/tiny-model", revision="v1")) == tagged.resolve()
    assert resolve_model(str(tiny_model_dir)) == str(tiny_model_dir)


@pytest.mark.parametrize("error, cause", [
    ("GatedRepoError", "a gated model on the Hub; accept its terms"),
    ("RepositoryNotFoundError", "no such model on the Hub"),
    ("RevisionNotFoundError", "the model has no revision 'v9'"),
])
def test_hub_refusals_are_one_line_naming_the_id(error, cause, monkeypatch):
    """What the Hub answers for a gated, missing or mis-versioned repository (no Hub here: huggingface_hub's own
    exception, raised where snapshot_download would raise it)."""
    import huggingface_hub
    from huggingface_hub import errors

    def refuse(*args, **kwargs):
        cls = getattr(errors, error)
        exc = cls.__new__(cls)  # its __init__ wants the HTTP response, whose class differs between releases
        Exception.__init__(exc, "the Hub's own multi-line\nmessage")
        raise exc

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    with pytest.raises(HubError) as info:
        resolve_model("tiny-org/tiny-model", revision="v9")
    message = str(info.value)
    assert message.startswith("model.name_or_path 'tiny-org/tiny-model' (revision 'v9'): ") and cause in message
    assert "\n" not in message


def test_an_id_missing_from_the_cache_offline_says_so(offline_cache):
    with pytest.raises(HubError, match=r"^model.name_or_path 'tiny-org/absent': not in the Hub cache \(.*\) and "
                                       r"HF_HUB_OFFLINE is set"):
        resolve_model("tiny-org/absent")


def grpo_engine(cache: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache),
               HF_DATASETS_CACHE=str(cache.parent / "datasets"))
    return subprocess.run([sys.executable, "-m", "grpo_engine", *args], capture_output=True, text=True, timeout=300,
                          env=env, cwd=ROOT)


SMALL = ["--max-steps", "1", "--run.progress_bar", "false", "--run.plot", "false", "--rollout.num_generations", "2",
         "--rollout.max_new_tokens", "4", "--optim.per_device_train_batch_size", "4", "--run.log_completions_steps",
         "0"]


@pytest.mark.slow
def test_train_lora_on_a_hub_model_offline_and_eval_its_checkpoint(tmp_path, tiny_model_dir):
    """--model ORG/NAME from the cache; the LoRA checkpoint names its base by that id, and `eval` loads the base by
    it; a missing id stops the run in one line before the run directory exists."""
    cache = tmp_path / "hub"
    write_hub_repo(cache, "model", "tiny-org/tiny-model", model_files(tiny_model_dir))
    data = tmp_path / "train.jsonl"
    data.write_text(jsonl([{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]))
    run_dir = tmp_path / "run"
    result = grpo_engine(cache, "train", "--model", "tiny-org/tiny-model", "--data", str(data), "--output-dir",
                         str(run_dir), "--model.lora.enabled", "true", *SMALL)
    assert result.returncode == 0, result.stderr[-3000:]
    adapters = run_dir / "checkpoints" / "checkpoint-000001" / "model"
    assert json.loads((adapters / "adapter_config.json").read_text())["base_model_name_or_path"] == "tiny-org/tiny-model"
    evaluated = grpo_engine(cache, "eval", "--model", str(adapters), "--data", str(data), "--rollout.max_new_tokens", "4")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert json.loads(evaluated.stdout)["num_prompts"] == 2.0

    missing = grpo_engine(cache, "train", "--model", "tiny-org/absent", "--data", str(data), "--output-dir",
                          str(tmp_path / "never"), *SMALL)
    assert missing.returncode == 1
    lines = missing.stderr.strip().splitlines()
    assert len(lines) == 1 and "'tiny-org/absent'" in lines[0] and "HF_HUB_OFFLINE is set" in lines[0], lines
    assert not (tmp_path / "never").exists()



def test_gsm8k_and_math_format_datasets_by_id(offline_cache):
    pytest.importorskip("datasets", reason="Hub datasets are read with the `datasets` package, not installed here")
    write_hub_repo(offline_cache, "dataset", "tiny-org/gsm8k", {
        "README.md": GSM8K_README, "main/train.jsonl": jsonl(GSM8K_ROWS["train"]),
        "main/test.jsonl": jsonl(GSM8K_ROWS["test"])})
    write_hub_repo(offline_cache, "dataset", "tiny-org/math", {"data/train.jsonl": jsonl(MATH_ROWS)})
    train = load_prompt_rows("tiny-org/gsm8k", "question", 1000, "main", "train")
    assert train == GSM8K_ROWS["train"] and reference_answer(train[1]["answer"]) == "3"
    assert load_hub_dataset("tiny-org/gsm8k", "main", "test") == GSM8K_ROWS["test"]
    math_rows = load_prompt_rows("tiny-org/math", "problem", 1000)
    assert math_rows == MATH_ROWS and reference_answer(math_rows[0]["solution"]) == "3"
    with pytest.raises(HubError, match=r"^data.path 'tiny-org/gsm8k' \(data.config 'main', split 'validation'\): "
                                       r"Unknown split \"validation\""):
        load_hub_dataset("tiny-org/gsm8k", "main", "validation")
    with pytest.raises(HubError, match=r"^data.path 'tiny-org/absent': not in the Hub cache"):
        load_hub_dataset("tiny-org/absent", None, "train")


@pytest.mark.slow
def test_train_on_a_hub_dataset_offline(tmp_path, tiny_model_dir):
    pytest.importorskip("datasets", reason="Hub datasets are read with the `datasets` package, not installed here")
    cache = tmp_path / "hub"
    write_hub_repo(cache, "model", "tiny-org/tiny-model", model_files(tiny_model_dir))
    write_hub_repo(cache, "dataset", "tiny-org/gsm8k", {
        "README.md": GSM8K_README, "main/train.jsonl": jsonl(GSM8K_ROWS["train"]),
        "main/test.jsonl": jsonl(GSM8K_ROWS["test"])})
    result = grpo_engine(cache, "train", "--model", "tiny-org/tiny-model", "--data", "tiny-org/gsm8k",
                         "--data.config", "main", "--data.prompt_column", "question", "--data.eval_path",
                         "tiny-org/gsm8k", "--output-dir", str(tmp_path / "run"), *SMALL)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "accuracy on the 1 evaluation prompts" in result.stdout  # the test split of the same id


def test_a_hub_id_in_a_yaml_file_stays_an_id_unless_a_file_of_that_name_is_beside_it(tmp_path):
    from grpo_engine.config import load_config

    (tmp_path / "c.yaml").write_text("data:\n  path: tiny-org/gsm8k\n  eval_path: local/test.jsonl\n")
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "test.jsonl").write_text(jsonl([{"prompt": "1+1=", "answer": "2"}]))
    config = load_config(tmp_path / "c.yaml")
    assert config.data.path == "tiny-org/gsm8k"
    assert config.data.eval_path == str(tmp_path / "local" / "test.jsonl")

