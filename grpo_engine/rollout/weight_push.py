"""How the trained weights reach the vLLM servers after every optimizer step, through vLLM's own mechanisms.

`reload` (any device; the one a CPU has): training process 0 writes the weights in checkpoint format to a
safetensors file in `rollout.server.weights_dir` (which every server must read: a shared filesystem past one
machine) and asks each server to reload from it (`POST /collective_rpc`, method `reload_weights`; the server needs
VLLM_SERVER_DEV_MODE=1), then to reset its prefix cache (`POST /reset_prefix_cache`): no cached key or value of
the old weights survives.

`nccl` (CUDA): vLLM's weight-transfer API, driven by vLLM's own trainer-side engine
(`NCCLTrainerWeightTransferEngine` with its HTTP client): once, training process 0 and the server's workers form
an NCCL group (`POST /init_weight_transfer_engine`); at every push `POST /start_weight_update`, `POST
/update_weights` with the tensors' names, dtypes and shapes while process 0 broadcasts them, `POST
/finish_weight_update`, then `POST /reset_prefix_cache`. No request is in flight meanwhile: the trainer pushes
only once its generations have finished. One server (of any number of GPUs): vLLM's engine places the workers
at ranks 1..N of one group.

`adapter` (LoRA, any device): the servers keep their base weights and get only the trained LoRA adapter, through
vLLM's runtime LoRA endpoints (the server needs --enable-lora, --max-lora-rank at least the adapter's rank and
VLLM_ALLOW_RUNTIME_LORA_UPDATING=True: `grpo-engine serve --lora-rank R`). Training process 0 saves the adapter
(peft's save_pretrained) into a new directory of `rollout.server.weights_dir` and loads it on every server
(`POST /v1/load_lora_adapter`) under a name of its own; completion requests then name it as their model. Each
push has a new name and a new directory: vLLM keys its prefix cache by the adapter's name and path, so no cached
key or value of an older adapter is reused, and a push retried after a partial failure never meets a name that
is taken. Once every server holds the new adapter, the older ones are unloaded (`POST /v1/unload_lora_adapter`)
and their directories deleted.

Every process takes part in a push (sharded weights are gathered one tensor at a time); process 0 alone talks to
the servers and tells the others whether the push succeeded (and which adapter they now name), so all raise
together when it did not.
"""

from __future__ import annotations

import shutil
import socket
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Protocol

import torch
from torch import nn

from ..config import ConfigError, EngineConfig
from ..state.atomic_file import replacing
from .http_client import ServerClient, ServerUnavailable
from .vllm import checkpoint_weights

WEIGHTS_FILE = "model.safetensors"


ADAPTER_PREFIX = "grpo-policy-"  # the served name and directory of every adapter the trainer loads


class WeightPush(Protocol):
    def push(self, lm: nn.Module, version: int) -> Optional[str]:
        """Sends `lm` (holding `version` optimizer rounds) to every server; returns the model name completion
        requests must give from now on (None: the served model's own)."""
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
    weights_dir = Path(s.weights_dir or Path(run_dir) / "server_weights")
    if config.pushes_lora_adapters():
        return AdapterPush(weights_dir, clients, world)
    if weight_transfer(config, device) == "nccl":
        if len(clients) > 1:
            raise ConfigError("rollout.server.weight_transfer nccl reaches one server (vLLM's trainer-side engine "
                              "puts its workers at ranks 1..N of one group): give one URL (that server may use "
                              "several GPUs), or weight_transfer reload")
        return NCCLPush(config, clients, world)
    return ReloadPush(weights_dir, clients, world)


class _Collective:
    """Process 0 does the talking; every process learns its outcome."""

    def __init__(self, world: Optional[Any]) -> None:
        self.world = world
        self.num_processes = getattr(world, "num_processes", 1)
        self.is_main = getattr(world, "process_index", 0) == 0

    def agree(self, failure: Optional[BaseException], result: Any = None) -> Any:
        """Raises WeightPushFailed on every process when process 0's step failed (its message travels to the
        others): every process then retries, or stops, alike. Otherwise process 0's `result`, on every process."""
        message = None if failure is None else f"{type(failure).__name__}: {failure}"
        if self.num_processes > 1:
            import torch.distributed as dist

            box = [(message, result)]
            dist.broadcast_object_list(box, src=0)
            message, result = box[0]
        if message is not None:
            raise WeightPushFailed(message)
        return result


class WeightPushFailed(ServerUnavailable):
    def __init__(self, message: str) -> None:
        ConnectionError.__init__(self, f"the weight push failed ({message})")
        self.url, self.waited_s = "", 0.0


class ReloadPush(_Collective):
    def __init__(self, weights_dir: Path, clients: list[ServerClient], world: Optional[Any]) -> None:
        super().__init__(world)
        self.weights_dir, self.clients = weights_dir, clients

    def push(self, lm: nn.Module, version: int) -> None:
        from safetensors.torch import save_file

        weights = {}
        for name, tensor in checkpoint_weights(lm):  # every process: the gathers of sharded weights are collective
            if self.is_main:
                weights[name] = tensor.detach().to("cpu", copy=True).contiguous()
        failure = None
        if self.is_main:
            try:
                self.weights_dir.mkdir(parents=True, exist_ok=True)
                # Written whole beside it, under a name no server reads (not *.safetensors), then renamed over it
                with replacing(self.weights_dir / WEIGHTS_FILE, keep_suffix=False) as partial:
                    save_file(weights, str(partial))
                for client in self.clients:
                    client.post("/collective_rpc", {"method": "reload_weights",
                                                    "kwargs": {"weights_path": str(self.weights_dir.resolve())}})
                    client.post("/reset_prefix_cache")
            except Exception as exc:  # noqa: BLE001 - every process must learn of it, whatever it is
                failure = exc
        self.agree(failure)

    def close(self) -> None:
        pass


class AdapterPush(_Collective):
    """The LoRA adapter alone, loaded on every server under a new name at each push (see the module's docstring)."""

    def __init__(self, adapters_dir: Path, clients: list[ServerClient], world: Optional[Any]) -> None:
        super().__init__(world)
        self.adapters_dir, self.clients = adapters_dir, clients

    def push(self, lm: nn.Module, version: int) -> str:
        name, failure = None, None
        if self.is_main:  # LoRA is never sharded (the schema refuses FSDP and tensor parallelism with it)
            try:
                name = self._load_everywhere(lm, f"{ADAPTER_PREFIX}v{version}-{uuid.uuid4().hex[:8]}")
            except Exception as exc:  # noqa: BLE001 - every process must learn of it, whatever it is
                failure = exc
        return self.agree(failure, name)

    def _load_everywhere(self, lm: nn.Module, name: str) -> str:
        self.adapters_dir.mkdir(parents=True, exist_ok=True)
        directory = self.adapters_dir / name
        with replacing(directory, keep_suffix=False) as partial:  # renamed once whole: no server reads it half-written
            lm.save_pretrained(str(partial))
        for client in self.clients:
            client.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(directory.resolve())})
        for client in self.clients:  # every server now serves `name`: the older adapters go
            models = client.get("/v1/models")
            for i in range(len(client.read_field(models, "GET /v1/models", "data", kind=list))):
                served = client.read_field(models, "GET /v1/models", "data", i, "id", kind=str)
                if served.startswith(ADAPTER_PREFIX) and served != name:
                    client.post("/v1/unload_lora_adapter", {"lora_name": served})
        for old in self.adapters_dir.glob(ADAPTER_PREFIX + "*"):
            if old != directory:
                shutil.rmtree(old, ignore_errors=True)
        return name

    def close(self) -> None:
        pass


class NCCLPush(_Collective):
    """vLLM's trainer-side NCCL weight-transfer engine (`NCCLTrainerWeightTransferEngine`) driving one server's
    `/init_weight_transfer_engine`, `/start_weight_update`, `/update_weights`, `/finish_weight_update` through
    vLLM's own HTTP client; every training process runs it (process 0 sends, the others join the gathers)."""

    def __init__(self, config: EngineConfig, clients: list[ServerClient], world: Optional[Any]) -> None:
        super().__init__(world)
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine

        s = config.rollout.server
        self.clients = clients
        failure, engine = None, None
        try:
            workers = clients[0].read_field(clients[0].get("/get_world_size"), "GET /get_world_size", "world_size",
                                            kind=int) if self.is_main else 0
            info = NCCLTrainerInitInfo(master_address=s.nccl_host or socket.gethostname(), master_port=s.nccl_port,
                                       world_size=1 + workers, rank=0 if self.is_main else 1)
            engine = NCCLTrainerWeightTransferEngine.trainer_init(
                info, client=HTTPVLLMWeightSyncClient(s.urls[0], timeout=s.request_timeout_s),
                source=checkpoint_source())
        except Exception as exc:  # noqa: BLE001 - every process must learn of it
            failure = exc
        self.agree(failure if self.is_main else None)
        self.engine = engine

    def push(self, lm: nn.Module, version: int) -> None:
        self.engine.source.lm = lm
        failure = None
        try:
            self.engine.send_weights()
            if self.is_main:
                self.clients[0].post("/reset_prefix_cache")
        except Exception as exc:  # noqa: BLE001
            failure = exc
        self.agree(failure if self.is_main else None)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()


def checkpoint_source_class() -> type:
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class _CheckpointSource(WeightSource):
        """The policy's weights in checkpoint format (LoRA merged, shards gathered: `checkpoint_weights`); their
        names, dtypes and shapes are read by one pass at the first push (a gather on every process, as the
        iteration itself)."""

        def __init__(self) -> None:
            self.lm: Optional[nn.Module] = None
            self._meta: Optional[list] = None

        def metadata(self) -> list:
            if self._meta is None:
                self._meta = [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in checkpoint_weights(self.lm)]
            return self._meta

        def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
            return checkpoint_weights(self.lm)

    return _CheckpointSource


def checkpoint_source() -> Any:
    """A vLLM WeightSource of the policy's checkpoint weights (vLLM imported only here: the nccl path needs it)."""
    return checkpoint_source_class()()
