"""The files a weight push writes for the servers to read (`reload`'s model.safetensors, `adapter`'s directories)
are written whole or not at all, under a temporary name no server reads (not *.safetensors, not an adapter's
name): a push stopped midway (a full disk, an I/O error, Ctrl-C, SIGTERM) leaves the previous weights as they
were and no partial file or directory behind. Before, a stopped push left `model.safetensors.partial` (on a full
disk, keeping it full) or an adapter's `.partial` directory."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import safetensors.torch
from hypothesis import HealthCheck, given, settings, strategies as st
from torch import nn

from grpo_engine.rollout import weight_push as wp

ERRORS = {"full disk": lambda: OSError(errno.ENOSPC, "No space left on device"),
          "i/o error": lambda: OSError(errno.EIO, "Input/output error"),
          "Ctrl-C": KeyboardInterrupt, "SIGTERM": lambda: SystemExit(143)}


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


class _Adapter(nn.Linear):
    def __init__(self, written: int, error) -> None:
        super().__init__(2, 2)
        self.written, self.error, self.seen = written, error, []

    def save_pretrained(self, path: str) -> None:
        Path(path).mkdir()
        (Path(path) / "adapter_model.safetensors").write_bytes(b"a" * self.written)
        self.seen.append(sorted(p.name for p in Path(path).parent.iterdir()))
        if self.error is not None:
            raise ERRORS[self.error]()
        (Path(path) / "adapter_config.json").write_text("{}")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(written=st.integers(0, 5000), error=st.sampled_from(sorted(ERRORS)), previous=st.booleans())
def test_a_stopped_reload_push_leaves_the_previous_weights_and_no_partial_file(written, error, previous,
                                                                               tmp_path_factory, monkeypatch):
    directory = tmp_path_factory.mktemp("weights")
    if previous:
        (directory / wp.WEIGHTS_FILE).write_bytes(b"the previous weights")
    before, seen = _files(directory), []

    def stopped(weights, path, *args, **kwargs):
        assert not path.endswith(".safetensors")  # a server reloading now never reads it
        Path(path).write_bytes(b"w" * written)
        seen.append(sorted(p.name for p in directory.glob("*.safetensors")))
        raise ERRORS[error]()

    monkeypatch.setattr(safetensors.torch, "save_file", stopped)
    monkeypatch.setattr(wp, "checkpoint_weights", lambda lm: iter(lm.state_dict().items()))
    expected = wp.WeightPushFailed if "OSError" in repr(ERRORS[error]()) else type(ERRORS[error]())
    with pytest.raises(expected) as raised:
        wp.ReloadPush(directory, [], None).push(nn.Linear(2, 2), 1)
    if expected is wp.WeightPushFailed:
        assert str(directory / wp.WEIGHTS_FILE) in str(raised.value) and "\n" not in str(raised.value)
    assert seen == [[wp.WEIGHTS_FILE] if previous else []]
    assert _files(directory) == before


def test_a_reload_push_replaces_the_weights_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(wp, "checkpoint_weights", lambda lm: iter(lm.state_dict().items()))
    (tmp_path / wp.WEIGHTS_FILE).write_bytes(b"the previous weights")
    lm = nn.Linear(2, 2)
    wp.ReloadPush(tmp_path, [], None).push(lm, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == [wp.WEIGHTS_FILE]
    loaded = safetensors.torch.load_file(str(tmp_path / wp.WEIGHTS_FILE))
    assert all((loaded[k] == v).all() for k, v in lm.state_dict().items())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(written=st.integers(0, 5000), error=st.sampled_from(sorted(ERRORS) + [None]))
def test_an_adapter_push_shows_the_servers_only_whole_adapters(written, error, tmp_path_factory):
    directory = tmp_path_factory.mktemp("adapters")
    older = directory / f"{wp.ADAPTER_PREFIX}v0-older"
    older.mkdir()
    (older / "adapter_config.json").write_text("{}")
    adapter = _Adapter(written, error)
    push = wp.AdapterPush(directory, [], None)
    if error is None:
        name = push.push(adapter, 1)
        assert sorted(_files(directory)) == [f"{name}/adapter_config.json", f"{name}/adapter_model.safetensors"]
    else:
        with pytest.raises(wp.WeightPushFailed if "OSError" in repr(ERRORS[error]()) else type(ERRORS[error]())):
            push.push(adapter, 1)
        assert sorted(p.name for p in directory.iterdir()) == [older.name]
    # while it was written, only the older adapter had an adapter's name
    assert [[n for n in names if n.startswith(wp.ADAPTER_PREFIX)] for names in adapter.seen] == [[older.name]]
