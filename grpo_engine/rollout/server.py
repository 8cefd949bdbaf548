"""The `vllm_server` rollout backend: completions from vLLM servers over their OpenAI-compatible HTTP API.

The servers run apart from training (other GPUs, other nodes; `grpo-engine serve` starts one with the settings
this backend needs). Each training process sends its completions to `rollout.server.urls[i % len(urls)]`, one
`/v1/completions` request per completion with the prompt as token ids and its own seed (drawn from the run's
RNG, as the colocated backend draws them, so both sample alike), and reads back the token ids and their
log-probs (`logprobs` with `return_tokens_as_token_ids`). The log-probs are the sampler's processed ones when
the server runs with `--logprobs-mode processed_logprobs` (`grpo-engine serve` sets it).

After every optimizer step the weights go to every server through vLLM's own mechanisms (weight_push.py), and
the backend's `version` becomes the number of optimizer steps the servers' weights hold. Under LoRA the push
loads the adapter under a new name, and the completion requests name it from then on. A server that failed to
answer may have restarted with its starting weights: from then on the version is unknown (None) until the next
push succeeds, and the trainer never puts a sample of unknown version into the loss. A server that no longer
knows the adapter a request names (HTTP 404: it restarted) is treated alike: the request is answered by its base
model, and the batch's version is unknown.

At start every server must list the model the run names and take its longest sequence (check_served_model);
every answer is read against what its request asked (completion_answer.py): one line naming the server and the
field, never a batch built from another model's token ids or a log-prob that is not one.

What the HTTP API cannot carry: the kept-token sets of a truncating sampler (refused by the schema with
rollout.replay_kept_tokens).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import torch
from torch import nn
from transformers import GenerationConfig, PreTrainedTokenizerBase

from ..config import ConfigError, EngineConfig
from ..launch_env import listen_problem
from ..model.limits import embedding_rows, scored_vocab_size
from ..model.loading import base_causal_lm
from .base import RolloutBatch, encode_prompts, eos_ids, finish_batch
from .completion_answer import CompletionAsk, read_completion
from .http_client import ServerClient, ServerRequestError
from .weight_push import WeightPush, WeightPushFailed, create_weight_push, weight_transfer

UNKNOWN = None  # the version of a server that may have lost its weights
PUSH_ATTEMPTS, PUSH_BACKOFF_S = 4, 0.5  # a push the server refused (a server that does not answer is retried longer)


def served_model_name(client: ServerClient) -> str:
    """The first model the server lists (GET /v1/models), checked to be a name."""
    return client.read_field(client.get("/v1/models"), "GET /v1/models", "data", 0, "id", kind=str)


def server_urls_for(config: EngineConfig, process_index: int) -> str:
    urls = config.rollout.server.urls
    return urls[process_index % len(urls)]


def check_servers_up(config: EngineConfig, process_index: int = 0) -> None:
    """The servers this process talks to answer GET /health now: said in one line before any work."""
    s = config.rollout.server
    urls = s.urls if process_index == 0 else [server_urls_for(config, process_index)]
    for url in urls:
        client = ServerClient(url, 0.0, s.request_timeout_s)
        down = client.down_reason()
        if down is not None:  # why, too: a TLS failure, a redirect or a proxy is not a server that is not started
            raise ConfigError(f"rollout.server.urls: no vLLM server answers at {url} (GET {url}/health: {down}): "
                              f"start one (grpo-engine serve --model DIR --port PORT) or correct the URL")
        check_served_model(client, config, url)
        if config.pushes_lora_adapters() and process_index == 0 and not takes_lora_adapters(client):
            raise ConfigError(f"rollout.server.lora_transfer: the vLLM server at {url} does not load LoRA adapters at "
                              f"runtime (no POST /v1/load_lora_adapter): start it with grpo-engine serve --lora-rank "
                              f"{config.model.lora.r}, or set rollout.server.lora_transfer merged")


def check_served_model(client: ServerClient, config: EngineConfig, url: str) -> None:
    """The model the run names (rollout.server.model) is one the server lists, and takes the run's longest sequence:
    a name it does not serve was an HTTP 404 at the first batch, after the weights had been pushed, and a shorter
    --max-model-len an HTTP 400 at the first prompt long enough, hours into a run."""
    s, r = config.rollout.server, config.rollout
    try:
        listed = client.get("/v1/models")
    except ServerRequestError as exc:  # a server that answers /health but is not vLLM's OpenAI server
        raise ConfigError(f"rollout.server.urls: the server at {url} does not list its models ({exc}): is it a vLLM "
                          f"server (grpo-engine serve)?") from None
    models = client.read_field(listed, "GET /v1/models", "data", kind=list)
    names = [m.get("id") for m in models if isinstance(m, dict)]
    if s.model is not None and s.model not in names:
        raise ConfigError(f"rollout.server.model {s.model!r}: the vLLM server at {url} serves {names}: name one of "
                          f"them, or null for the first")
    index = names.index(s.model) if s.model is not None else 0 if models else None
    entry = None if index is None else models[index]
    limit = None if not isinstance(entry, dict) or entry.get("max_model_len") is None else client.read_field(
        listed, "GET /v1/models", "data", index, "max_model_len", kind=int)  # "4096" would skip the check
    prompt = config.data.max_prompt_length
    longest = (prompt or 1) + r.max_new_tokens  # without a prompt bound at least one prompt token
    if limit is not None and limit < longest:
        needed = ("data.max_prompt_length + rollout.max_new_tokens" if prompt else
                  "a prompt token + rollout.max_new_tokens")
        raise ConfigError(f"rollout.server.urls: the vLLM server at {url} takes sequences up to {limit} tokens "
                          f"(its max_model_len), below {needed} = {longest}: start it with grpo-engine serve "
                          f"--max-model-len {longest}, or lower those settings")


def takes_lora_adapters(client: ServerClient) -> bool:
    """Whether the server has vLLM's runtime LoRA endpoints (VLLM_ALLOW_RUNTIME_LORA_UPDATING): an empty request
    is refused as invalid (4xx other than 404) where the route exists, 404 where it does not; nothing is loaded."""
    try:
        client.post("/v1/load_lora_adapter", {})
    except ServerRequestError as exc:
        return exc.status != 404
    return True


class VLLMServerRollout:
    """Completions from a vLLM server; `sync_weights` pushes the policy `lm` to every server."""

    def __init__(self, config: EngineConfig, lm: nn.Module, tokenizer: PreTrainedTokenizerBase, device: torch.device,
                 run_dir: str, world: Optional[Any] = None) -> None:
        s = config.rollout.server
        self.config, self.lm, self.tokenizer, self.device = config, lm, tokenizer, device
        self.process_index = getattr(world, "process_index", 0)
        self.eos = eos_ids(tokenizer, getattr(base_causal_lm(lm), "generation_config", None) or GenerationConfig())
        scored = scored_vocab_size(tokenizer, lm, config.rollout.sample_padded_vocab)
        self.allowed_token_ids = None if scored is None else list(range(scored))
        self.vocab_size = embedding_rows(lm) if scored is None else scored  # the token ids an answer may hold
        self._lock = threading.Lock()
        self.version: Optional[int] = UNKNOWN
        self.client = ServerClient(server_urls_for(config, self.process_index), s.timeout_s, s.request_timeout_s,
                                   on_failure=self._lost)
        self.base_model_name = s.model or served_model_name(self.client)
        self.model_name = self.base_model_name  # what completion requests name: the base model, or the adapter
        self.pool = ThreadPoolExecutor(s.max_concurrent_requests, thread_name_prefix="rollout-request")
        self.push: WeightPush = create_weight_push(config, device, run_dir, world, on_failure=self._lost)

    def _lost(self) -> None:
        with self._lock:
            self.version = UNKNOWN

    def sync_weights(self, version: int = 0) -> None:
        """Pushes the policy's weights (every process takes part: sharded weights are gathered); `version` is the
        number of optimizer steps they hold."""
        with self._lock:
            self.version = UNKNOWN  # while the servers take the new weights, neither version is certain
        for attempt in range(PUSH_ATTEMPTS):  # a fixed count: every process retries alike
            try:
                served = self.push.push(self.lm, version)
                break
            except WeightPushFailed:
                if attempt == PUSH_ATTEMPTS - 1:
                    raise
                time.sleep(PUSH_BACKOFF_S * 2**attempt)
        with self._lock:
            self.version = version
            self.model_name = served or self.base_model_name

    def draw_seeds(self, count: int) -> list[int]:
        """One seed per completion from the run's torch RNG (the training thread's): a resumed run draws the same."""
        return torch.randint(0, 2**31 - 1, (count,)).tolist()

    def generate(self, prompts: list[str], greedy: bool = False, record_kept: bool = False,
                 seeds: Optional[list[int]] = None) -> RolloutBatch:
        if record_kept:
            raise ConfigError("rollout.replay_kept_tokens: a vLLM server does not return its sampler's kept sets")
        r = self.config.rollout
        prompt_ids, prompt_mask = encode_prompts(self.tokenizer, prompts, self.config.data.max_prompt_length,
                                                 torch.device("cpu"))
        if seeds is None and not greedy:
            seeds = self.draw_seeds(len(prompts))
        with self._lock:
            version, model = self.version, self.model_name
        # min_p too: a field the request leaves out is taken from the model's generation_config.json by the server
        # (vLLM's --generation-config auto), which would truncate what is sampled past the rollout settings
        common: dict[str, Any] = dict(
            model=model, max_tokens=r.max_new_tokens, stop_token_ids=self.eos, logprobs=1,
            return_tokens_as_token_ids=True, skip_special_tokens=False, repetition_penalty=r.repetition_penalty,
            min_p=0.0)
        if self.allowed_token_ids is not None:
            common["allowed_token_ids"] = self.allowed_token_ids
        if greedy:
            common.update(temperature=0.0)
        else:
            common.update(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k if r.top_k > 0 else -1)
        payloads = [{**common, "prompt": ids[mask.bool()].tolist(),
                     **({} if greedy else {"seed": seeds[i]})}
                    for i, (ids, mask) in enumerate(zip(prompt_ids, prompt_mask))]
        ask = CompletionAsk(r.max_new_tokens, self.vocab_size, sampled=not greedy)
        choices = list(self.pool.map(lambda payload: self._complete(payload, ask), payloads))
        with self._lock:  # a failure during the requests (a possible restart) makes the whole batch's version unknown
            version = version if self.version == version else UNKNOWN
        batch = self._batch(prompts, prompt_ids, prompt_mask, choices, sampled=not greedy)
        batch.policy_version = torch.full((len(prompts),), -1 if version is UNKNOWN else version, dtype=torch.long)
        return batch

    def _complete(self, payload: dict, ask: CompletionAsk) -> tuple[list[int], Optional[list[float]]]:
        try:
            return self._choice(payload, ask)
        except ServerRequestError as exc:
            if exc.status != 404 or payload["model"] == self.base_model_name:
                raise
        # The server does not know the adapter: it restarted with its base model, whose answer counts as unknown.
        self._lost()
        return self._choice({**payload, "model": self.base_model_name}, ask)

    def _choice(self, payload: dict, ask: CompletionAsk) -> tuple[list[int], Optional[list[float]]]:
        """(token ids, log-probs) of the one completion a request asks for, checked against what it asked."""
        return read_completion(self.client, self.client.post("/v1/completions", payload), ask)

    def _batch(self, prompts: list[str], prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
               choices: list[tuple[list[int], Optional[list[float]]]], sampled: bool) -> RolloutBatch:
        length = max(1, max(len(row_ids) for row_ids, _ in choices))
        ids = torch.full((len(choices), length), self.tokenizer.pad_token_id, dtype=torch.long)
        logps = torch.zeros(len(choices), length) if sampled else None
        for row, (row_ids, values) in enumerate(choices):
            ids[row, :len(row_ids)] = torch.tensor(row_ids, dtype=torch.long)
            if logps is not None:
                logps[row, :len(values)] = torch.tensor(values)
        to = self.device
        return finish_batch(self.tokenizer, prompts, prompt_ids.to(to), prompt_mask.to(to), ids.to(to), self.eos,
                            self.config.rollout, None if logps is None else logps.to(to), None)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.push.close()


def create(context) -> VLLMServerRollout:
    """The rollout registry's factory (registry.py): the servers are given the policy at once, as version
    `context.start_version`."""
    backend = VLLMServerRollout(context.config, context.lm, context.tokenizer, context.device, context.run_dir,
                                context.world)
    backend.sync_weights(context.start_version)
    return backend


def check(config: EngineConfig, device: torch.device, num_processes: int = 1, process_index: int = 0) -> None:
    check_servers_up(config, process_index)
    check_nccl_port(config, device, process_index)


def check_nccl_port(config: EngineConfig, device: torch.device, process_index: int = 0) -> None:
    """Training process 0 hosts the NCCL weight-transfer group on rollout.server.nccl_port: a port another program
    holds is one line now, not vLLM's store error after the model has loaded."""
    if process_index != 0 or config.pushes_lora_adapters() or weight_transfer(config, device) != "nccl":
        return
    port = config.rollout.server.nccl_port
    problem = listen_problem("", port)
    if problem is not None:
        raise ConfigError(f"rollout.server.nccl_port {port}: training process 0 cannot listen on it ({problem}); "
                          f"another run or program holds it: set a free port")
