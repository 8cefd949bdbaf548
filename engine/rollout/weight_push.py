"""How the trained weights reach the vLLM servers after every optimizer step, through vLLM's own mechanisms.

`reload` (any device; the one a CPU has): training process 0 writes the weights in checkpoint format to a
safetensors file in `rollout.server.weights_dir` (which every server must read: a shared filesystem past one
machine) and asks each server to reload from it (`POST /collective_rpc`, method `reload_weights`; the server needs
VLLM_SERVER_DEV_MODE=1), then to reset its prefix cache (`POST /reset_prefix_cache`): no cached key or value of
the old weights survives.

`nccl` (CUDA): vLLM's weight-transfer API. Once, the servers and training process 0 form an NCCL group
(`POST /init_weight_transfer_engine` on each server, vLLM's `NCCLWeightTransferEngine.trainer_init` here, both at
once: the rendezvous waits for every member). At every push: `POST /pause` (no request runs on half-updated
weights), `POST /update_weights` with the tensors' names, dtypes and shapes, while this process broadcasts them
(`trainer_send_weights`), then `POST /reset_prefix_cache` and `POST /resume`.

Every process takes part in a push (sharded weights are gathered one tensor at a time); process 0 alone talks to
the servers and tells the others whether the push succeeded, so all raise together when it did not.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Protocol

import torch
from torch import nn

from ..config import EngineConfig
from .http_client import ServerClient, ServerUnavailable
from .vllm import checkpoint_weights

WEIGHTS_FILE = "model.safetensors"


class WeightPush(Protocol):
    def push(self, lm: nn.Module) -> None:
        ...

    def close(self) -> None:
        ...


def weight_transfer(config: EngineConfig, device: torch.device) -> str:
    chosen = config.rollout.server.weight_transfer
    return chosen if chosen != "auto" else ("nccl" if device.type == "cuda" else "reload")


def create_weight_push(config: EngineConfig, device: torch.device, run_dir: str, world: Optional[Any],
                       on_failure: Optional[Callable[[], None]] = None) -> WeightPush:
    s = config.rollout.server
    clients = [ServerClient(url, s.timeout_s, s.request_timeout_s, on_failure) for url in s.urls]
    if weight_transfer(config, device) == "nccl":
        return NCCLPush(config, clients, world)
    return ReloadPush(Path(s.weights_dir or Path(run_dir) / "server_weights"), clients, world)


class _Collective:
    """Process 0 does the talking; every process learns its outcome."""

    def __init__(self, world: Optional[Any]) -> None:
        self.world = world
        self.num_processes = getattr(world, "num_processes", 1)
        self.is_main = getattr(world, "process_index", 0) == 0

    def agree(self, failure: Optional[BaseException]) -> None:
        """Raises WeightPushFailed on every process when process 0's step failed (its message travels to the
        others): every process then retries, or stops, alike."""
        message = None if failure is None else f"{type(failure).__name__}: {failure}"
        if self.num_processes > 1:
            import torch.distributed as dist

            box = [message]
            dist.broadcast_object_list(box, src=0)
            message = box[0]
        if message is not None:
            raise WeightPushFailed(message)


class WeightPushFailed(ServerUnavailable):
    def __init__(self, message: str) -> None:
        ConnectionError.__init__(self, f"the weight push failed ({message})")
        self.url, self.waited_s = "", 0.0


class ReloadPush(_Collective):
    def __init__(self, weights_dir: Path, clients: list[ServerClient], world: Optional[Any]) -> None:
        super().__init__(world)
        self.weights_dir, self.clients = weights_dir, clients

    def push(self, lm: nn.Module) -> None:
        from safetensors.torch import save_file

        weights = {}
        for name, tensor in checkpoint_weights(lm):  # every process: the gathers of sharded weights are collective
            if self.is_main:
                weights[name] = tensor.detach().to("cpu", copy=True).contiguous()
        failure = None
        if self.is_main:
            try:
                self.weights_dir.mkdir(parents=True, exist_ok=True)
                partial = self.weights_dir / (WEIGHTS_FILE + ".partial")  # not *.safetensors: never read half-written
                save_file(weights, str(partial))
                os.replace(partial, self.weights_dir / WEIGHTS_FILE)
                for client in self.clients:
                    client.post("/collective_rpc", {"method": "reload_weights",
                                                    "kwargs": {"weights_path": str(self.weights_dir.resolve())}})
                    client.post("/reset_prefix_cache")
            except Exception as exc:  # noqa: BLE001 - every process must learn of it, whatever it is
                failure = exc
        self.agree(failure)

    def close(self) -> None:
        pass


class NCCLPush(_Collective):
    """vLLM's NCCL weight transfer: one group of training process 0 and every server's workers."""

    def __init__(self, config: EngineConfig, clients: list[ServerClient], world: Optional[Any]) -> None:
        super().__init__(world)
        self.clients, self.group = clients, None
        s = config.rollout.server
        self.host, self.port = s.nccl_host or socket.gethostname(), s.nccl_port
        failure = None
        if self.is_main:
            try:
                self._init_group()
            except Exception as exc:  # noqa: BLE001
                failure = exc
        self.agree(failure)

    def _init_group(self) -> None:
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        sizes = [int(client.get("/get_world_size")["world_size"]) for client in self.clients]
        world_size = 1 + sum(sizes)
        offsets = [1 + sum(sizes[:i]) for i in range(len(sizes))]
        threads = [threading.Thread(target=client.post, args=("/init_weight_transfer_engine", {"init_info": dict(
            master_address=self.host, master_port=self.port, rank_offset=offset, world_size=world_size)}))
            for client, offset in zip(self.clients, offsets)]
        for thread in threads:
            thread.start()
        self.group = NCCLWeightTransferEngine.trainer_init(dict(
            master_address=self.host, master_port=self.port, world_size=world_size))
        for thread in threads:
            thread.join()

    def push(self, lm: nn.Module) -> None:
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        names, dtypes, shapes = [], [], []
        tensors: list[tuple[str, torch.Tensor]] = []
        for name, tensor in checkpoint_weights(lm):
            if self.is_main:
                tensors.append((name, tensor))
                names.append(name)
                dtypes.append(str(tensor.dtype).removeprefix("torch."))
                shapes.append(list(tensor.shape))
        failure = None
        if self.is_main:
            try:
                for client in self.clients:
                    client.post("/pause")
                update = {"update_info": dict(names=names, dtype_names=dtypes, shapes=shapes, packed=True)}
                threads = [threading.Thread(target=client.post, args=("/update_weights", update))
                           for client in self.clients]
                for thread in threads:
                    thread.start()
                NCCLWeightTransferEngine.trainer_send_weights(_iterate(tensors), {"group": self.group, "packed": True})
                for thread in threads:
                    thread.join()
                for client in self.clients:
                    client.post("/reset_prefix_cache")
                    client.post("/resume")
            except Exception as exc:  # noqa: BLE001
                failure = exc
        self.agree(failure)

    def close(self) -> None:
        if self.is_main and self.group is not None:
            for client in self.clients:
                try:
                    client.post("/shutdown_weight_transfer_engine")
                except (ServerUnavailable, RuntimeError):
                    pass  # the server is gone: nothing left to shut down


def _iterate(tensors: list[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    yield from tensors
