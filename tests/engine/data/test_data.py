import json

import pytest

from grpo_engine.data.demo_task import addition_problems, build_char_tokenizer
from grpo_engine.data.prompts import (DataError, PromptSampler, check_prompt_column, check_prompt_lengths,
                                  check_prompts_present, load_prompt_rows, load_rows, render_prompt, reward_columns)
from repo_paths import ROOT


def test_jsonl_and_json_array(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"prompt": "x", "answer": 1}\n\n{"prompt": "y", "answer": 2}\n')
    (tmp_path / "b.json").write_text(json.dumps([{"prompt": "x"}]))
    assert [r["answer"] for r in load_rows(str(tmp_path / "a.jsonl"))] == [1, 2]
    assert load_rows(str(tmp_path / "b.json")) == [{"prompt": "x"}]


def test_bad_json_line_is_located(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"prompt": "x"}\n{oops\n')
    with pytest.raises(DataError, match="a.jsonl:2: invalid JSON"):
        load_rows(str(tmp_path / "a.jsonl"))


@pytest.mark.parametrize("name, text, where, key", [
    ("a.jsonl", '{"prompt": "x", "answer": 1}\n{"prompt": "y", "answer": 2, "prompt": "z"}\n', "a.jsonl:2", "prompt"),
    ("b.json", '[{"prompt": [{"role": "user", "role": "system", "content": "x"}]}]', "b.json", "role"),
])
def test_a_key_written_twice_in_one_object_is_refused(tmp_path, name, text, where, key):
    # json.loads keeps the last one silently: a row's prompt or answer would be replaced by a later value
    (tmp_path / name).write_text(text)
    with pytest.raises(DataError, match=f"^{tmp_path / where}: the key '{key}' appears twice in one object$"):
        load_rows(str(tmp_path / name))


@pytest.mark.parametrize("prompt", [[1, 2], [{"role": "user"}], [{"content": "1+1="}], ["1+1="],
                                    [{"role": "user", "content": 5}]])
def test_a_list_prompt_must_hold_chat_messages(prompt):
    with pytest.raises(DataError, match="row 0: the prompt \\('prompt'\\) is a list of chat messages, and message 0 "):
        check_prompts_present([{"prompt": prompt}], "prompt", "d.jsonl")
    check_prompts_present([{"prompt": [{"role": "user", "content": "1+1="}]}], "prompt", "d.jsonl")


@pytest.mark.parametrize("name, content", [
    ("a.jsonl", b'{"prompt": "x"}\n{"prompt": "caf\xe9"}\n'),  # latin-1 bytes on line 2
    ("b.json", b'[\n{"prompt": "x"},\n{"prompt": "\xff"}\n]'),  # line 3
])
def test_non_utf8_bytes_are_located(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    line = 2 if name == "a.jsonl" else 3
    column = 1 + content.splitlines()[line - 1].index(b"\xe9" if name == "a.jsonl" else b"\xff")
    with pytest.raises(DataError, match=rf"{name}:{line}: not valid UTF-8 \(byte 0x(e9|ff) at column {column}\)"):
        load_rows(str(path))


def test_a_runaway_prompt_is_refused_before_tokenizing(tmp_path):
    path = tmp_path / "a.jsonl"
    rows = [{"prompt": "1+1="}, {"prompt": "x" * 2_000_001}, {"prompt": [{"role": "user", "content": "y" * 150}]}]
    path.write_text("\n".join(json.dumps(row) for row in rows))
    with pytest.raises(DataError, match=r"a.jsonl' row 1: the prompt has 2,000,001 characters, more than "
                                        r"data.max_prompt_chars \(100,000\)"):
        load_prompt_rows(str(path), "prompt", 100_000)
    with pytest.raises(DataError, match="row 2: the prompt has 150 characters"):  # chat messages count their text
        check_prompt_lengths([rows[0], {"prompt": "z" * 100}, rows[2]], "prompt", "f", 100)
    assert len(load_prompt_rows(str(path), "prompt", None)) == 3  # null: no bound


def test_missing_prompt_column_names_columns():
    with pytest.raises(DataError, match=r"no 'prompt' column in row 0 \(columns: \['answer', 'question'\]\)"):
        check_prompt_column([{"question": "q", "answer": "1"}], "prompt", "file.jsonl")


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["a", "b"], "answer": ["1", "2"]}), tmp_path / "d.parquet")
    assert load_rows(str(tmp_path / "d.parquet"))[1] == {"prompt": "b", "answer": "2"}


def test_shipped_gsm8k_example_has_prompts():

    path = ROOT / "examples" / "gsm8k_sample.jsonl"
    rows = load_rows(str(path))
    check_prompt_column(rows, "question", str(path))
    assert all("####" in row["answer"] for row in rows)


def test_chat_prompts_go_through_the_template():
    tokenizer = build_char_tokenizer()
    messages = [{"role": "user", "content": "1+1="}]
    assert render_prompt(messages, tokenizer, None) == "user: 1+1=\nassistant: "
    assert render_prompt("1+1=", tokenizer, "be brief") == "system: be brief\nuser: 1+1=\nassistant: "
    assert render_prompt("1+1=", tokenizer, None) == "1+1="
    with pytest.raises(DataError, match="must be a string or a list"):
        render_prompt(3, tokenizer, None)


def test_reward_columns_exclude_the_prompt():
    assert reward_columns([{"prompt": "p", "answer": "1"}, {"prompt": "q", "x": 2}], "prompt") == {
        "answer": ["1", None], "x": [None, 2]}


def test_sampler_covers_each_epoch_and_resumes_mid_epoch():
    sampler = PromptSampler(5, seed=0)
    first_epoch = sampler.next_indices(5)
    assert sorted(first_epoch) == list(range(5))
    straddling = sampler.next_indices(3) + sampler.next_indices(4)  # crosses into epoch 2
    assert sorted(straddling[:5]) == list(range(5))
    state = sampler.state_dict()
    assert state == {"epoch": 2, "offset": 2}
    expected = sampler.next_indices(6)
    resumed = PromptSampler(5, seed=0)
    resumed.load_state_dict(state)
    assert resumed.next_indices(6) == expected


def test_addition_task_splits():
    train, evaluation = addition_problems(9, 0, seed=1)
    assert len(train) == 100 and evaluation is train
    train, held_out = addition_problems(9, 20, seed=1)
    assert len(train) == 80 and len(held_out) == 20
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held_out}
    assert all(int(r["answer"]) == sum(map(int, r["prompt"][:-1].split("+"))) for r in train)
