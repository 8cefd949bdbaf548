"""The NCCL weight push (rollout.server.weight_transfer nccl) drives vLLM's own trainer-side engine and HTTP client
against a stand-in server: the requests, their order and payloads (every checkpoint weight's name, dtype and
shape), the tensors handed to the broadcast, and a failed update. Only NCCL itself is left out (no NCCL on a CPU):
the communicator and the broadcast are recorded instead. Runs in CI's vLLM environment."""

from __future__ import annotations

import pytest
import torch

from grpo_engine.config import load_config
from tests.support.fake_vllm_server import FakeVLLMServer
from tests.support.server_models import save_model

pytestmark = pytest.mark.vllm


class _Recorded(list):
    """The tensors of each broadcast; `communicator` the stand-in NCCL group's class."""


@pytest.fixture()
def nccl_recorded(monkeypatch):
    pytest.importorskip("vllm")
    from vllm.distributed.weight_transfer import nccl_engine

    sent = _Recorded()

    class Communicator:  # what open_trainer_endpoint returns: the NCCL group, torn down at close
        destroyed = False

        def destroy(self) -> None:
            Communicator.destroyed = True

    monkeypatch.setattr(nccl_engine, "open_trainer_endpoint", lambda info: Communicator())
    sent.communicator = Communicator

    def broadcast(self, source, meta):
        sent.append([(name, tensor.detach().clone()) for name, tensor in source])

    monkeypatch.setattr(nccl_engine.NCCLTrainerWeightTransferEngine, "_broadcast", broadcast)
    monkeypatch.setattr(nccl_engine.NCCLTrainerWeightTransferEngine, "_post_send_sync", lambda self: None)
    return sent


@pytest.fixture()
def served(tmp_path):
    fake = FakeVLLMServer(str(save_model(tmp_path / "model"))).start()
    fake.world_size = 2
    yield fake
    fake.stop()


def _push(served, port=29517):
    from grpo_engine.rollout.http_client import ServerClient
    from grpo_engine.rollout.weight_push import NCCLPush

    config = load_config(overrides={"rollout.backend": "vllm_server", "rollout.server.urls": [served.url],
                                    "rollout.server.weight_transfer": "nccl", "rollout.server.nccl_host": "127.0.0.1",
                                    "rollout.server.nccl_port": port, "rollout.server.timeout_s": 2.0})
    return NCCLPush(config, [ServerClient(served.url, 2.0, 5.0)], world=None)


def test_each_push_sends_every_checkpoint_weight_through_vllms_engine(served, nccl_recorded):
    from transformers import AutoModelForCausalLM

    from grpo_engine.rollout.vllm import checkpoint_weights

    push = _push(served)
    paths = [path for path, _ in served.calls]
    assert paths == ["/init_weight_transfer_engine"]
    init = served.calls[0][1]["init_info"]
    assert init["world_size"] == 3 and init["rank_offset"] == 1  # the trainer at rank 0, two workers after it
    assert init["master_address"] == "127.0.0.1" and init["master_port"] == 29517

    lm = AutoModelForCausalLM.from_pretrained(served.model_dir)
    expected = [(name, tensor.detach().clone()) for name, tensor in checkpoint_weights(lm)]
    for round_ in range(2):
        served.calls.clear()
        push.push(lm, round_ + 1)
        assert [path for path, _ in served.calls] == ["/start_weight_update", "/update_weights",
                                                      "/finish_weight_update", "/reset_prefix_cache"]
        update = served.calls[1][1]["update_info"]
        assert update["names"] == [name for name, _ in expected]
        assert update["dtype_names"] == [str(t.dtype).removeprefix("torch.") for _, t in expected]
        assert update["shapes"] == [list(t.shape) for _, t in expected]
        assert [name for name, _ in nccl_recorded[-1]] == update["names"]
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(nccl_recorded[-1], expected))
        with torch.no_grad():  # the next round sends the trained weights, not the first ones
            next(lm.parameters()).add_(1.0)
        expected = [(name, tensor.detach().clone()) for name, tensor in checkpoint_weights(lm)]
    push.close()
    assert nccl_recorded.communicator.destroyed  # the transfer group is torn down with the run


def test_a_refused_update_fails_the_push(served, nccl_recorded):
    from transformers import AutoModelForCausalLM

    from grpo_engine.rollout.weight_push import WeightPushFailed

    push = _push(served, port=29518)
    served.fail_weight_updates = 1
    with pytest.raises(WeightPushFailed, match="the weight push failed"):
        push.push(AutoModelForCausalLM.from_pretrained(served.model_dir), 1)
