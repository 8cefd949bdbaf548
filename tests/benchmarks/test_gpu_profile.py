"""benchmarks.gpu.profile splits each step into its kernels (CPU operators here, at a small stand-in shape)."""

import pytest

from benchmarks.gpu import profile


def test_profile_tables_name_each_path_and_its_operators(tmp_path, capsys):
    out = tmp_path / "profile.md"
    assert profile.main(["--paths", "floor,torch", "--operations", "logprobs", "--steps", "1",
                         "--out", str(out)]) == 0
    text = out.read_text()
    assert "### logprobs | floor" in text and "### logprobs | torch" in text
    floor = text.split("### logprobs | floor")[1].split("###")[0]
    assert "aten::matmul" in floor or "aten::mm" in floor  # the bare GEMM is the floor's one operator


@pytest.mark.parametrize("argv, option", [
    (["--shape", "S9"], "--shape"), (["--paths", "floor,no-such-path"], "--paths"),
    (["--operations", "logprobs,los"], "--operations"), (["--steps", "0"], "--steps")])
def test_profile_refuses_an_unknown_name_or_count_in_one_line_before_profiling(argv, option, capsys, monkeypatch):
    monkeypatch.setattr(profile, "profile_lines", lambda *args: pytest.fail("profiling started"))
    with pytest.raises(SystemExit) as stop:
        profile.main(argv)
    lines = capsys.readouterr().err.splitlines()
    assert stop.value.code == 2 and len(lines) == 1 and f"argument {option}:" in lines[0], lines
