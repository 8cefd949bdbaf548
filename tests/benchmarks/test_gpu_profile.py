"""benchmarks.gpu.profile splits each step into its kernels (CPU operators here, at a small stand-in shape)."""

from benchmarks.gpu import profile


def test_profile_tables_name_each_path_and_its_operators(tmp_path, capsys):
    out = tmp_path / "profile.md"
    assert profile.main(["--paths", "floor,torch,no-such-path", "--operations", "logprobs", "--steps", "1",
                         "--out", str(out)]) == 0
    text = out.read_text()
    assert "### logprobs | floor" in text and "### logprobs | torch" in text
    floor = text.split("### logprobs | floor")[1].split("###")[0]
    assert "aten::matmul" in floor or "aten::mm" in floor  # the bare GEMM is the floor's one operator
    assert "### logprobs | no-such-path\nFAILED" in text or "### logprobs | no-such-path\nskipped" in text


def test_profile_refuses_an_unknown_shape(capsys):
    assert profile.main(["--shape", "S9"]) == 2
    assert "--shape must be one of" in capsys.readouterr().err
