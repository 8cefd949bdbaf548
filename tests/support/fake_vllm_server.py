"""A small stand-in for a vLLM server (stdlib http.server in a thread) with the endpoints the vllm_server backend
uses: GET /health, GET /v1/models, POST /v1/completions (token-id prompts; greedy, or seeded sampling with
temperature / top-k / top-p; `logprobs` of the sampled tokens under the processed distribution; tokens as
token_id:N), POST /collective_rpc reload_weights (safetensors from a directory), POST /reset_prefix_cache, GET
/get_world_size and the weight-transfer endpoints (recorded, with `fail_weight_updates` 500s), and vLLM's runtime
LoRA endpoints: POST /v1/load_lora_adapter (a peft adapter directory, served under its name, listed
by /v1/models; answered in plain text as vLLM does), POST /v1/unload_lora_adapter.

It samples from a real Hugging Face model, so a run against it trains. Faults for the tests: `fail_requests`
answers that many requests with 503, `fail_rpc` that many weight reloads with 500, `fail_lora_loads` that many
adapter loads with 500, `runtime_lora` False drops the LoRA endpoints (a server started without
VLLM_ALLOW_RUNTIME_LORA_UPDATING), `stop()` / `start()` take it down and bring it back (with its starting weights
and no adapter, as a restarted server), `delay_s` slows each completion.
Runnable as a process: python -m tests.support.fake_vllm_server --model DIR --port PORT.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional

import torch


# vLLM's weight-transfer API (the trainer drives it through vLLM's own HTTPVLLMWeightSyncClient)
WEIGHT_TRANSFER_PATHS = ("/init_weight_transfer_engine", "/start_weight_update", "/update_weights",
                         "/finish_weight_update", "/shutdown_weight_transfer_engine")


class FakeVLLMServer:
    def __init__(self, model_dir: str, port: int = 0, delay_s: float = 0.0) -> None:
        self.model_dir, self.port, self.delay_s = model_dir, port, delay_s
        self.fail_requests = 0
        self.fail_rpc = 0
        self.die_after_completions: Optional[int] = None  # then 503 to everything but /health, for good
        self.reloads: list[str] = []
        self.fail_lora_loads = 0
        self.runtime_lora = True
        self.adapters: dict[str, tuple[str, Any]] = {}  # served name: (directory, the base model with it merged)
        self.adapter_loads: list[str] = []
        self.completions = 0
        self.world_size = 1  # the server's inference workers (GET /get_world_size)
        self.calls: list[tuple[str, Optional[dict]]] = []  # weight-transfer requests and prefix-cache resets
        self.fail_weight_updates = 0
        self.lock = threading.Lock()
        self.httpd: Optional[ThreadingHTTPServer] = None
        self.model = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "FakeVLLMServer":
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, torch_dtype=torch.float32).eval()
        self.adapters = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server._answer(self, "GET", None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                server._answer(self, "POST", body)

        ThreadingHTTPServer.allow_reuse_address = True
        ThreadingHTTPServer.request_queue_size = 256  # every completion request of a batch at once, as vLLM takes them
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

    def _answer(self, handler: BaseHTTPRequestHandler, method: str, body: Optional[dict]) -> None:
        path = handler.path
        status, answer = 200, {}
        try:
            dead = self.die_after_completions is not None and self.completions >= self.die_after_completions
            if dead:
                status, answer = 503, {"error": "gone"}
            elif self.fail_requests > 0 and path != "/health":
                self.fail_requests -= 1
                status, answer = 503, {"error": "unavailable"}
            elif path == "/health":
                answer = None
            elif path == "/v1/models":
                answer = {"data": [{"id": self.model_dir}] + [{"id": name, "root": directory, "parent": self.model_dir}
                                                              for name, (directory, _) in self.adapters.items()]}
            elif path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter") and self.runtime_lora:
                status, answer = self._adapter_call(path, body or {})
            elif path == "/v1/completions":
                answer = self._complete(body)
            elif path == "/collective_rpc":
                if self.fail_rpc > 0:
                    self.fail_rpc -= 1
                    status, answer = 500, {"error": "reload failed"}
                else:
                    self._reload(body)
            elif path == "/reset_prefix_cache":
                answer = None
                self.calls.append((path, None))
            elif path == "/get_world_size":
                answer = {"world_size": self.world_size}
            elif path in WEIGHT_TRANSFER_PATHS:  # recorded; the NCCL side is the test's (no NCCL on a CPU)
                self.calls.append((path, body))
                if self.fail_weight_updates > 0 and path == "/update_weights":
                    self.fail_weight_updates -= 1
                    status, answer = 500, {"error": "update failed"}
            else:
                status, answer = 404, {"error": f"no route {path}"}
        except LookupError as exc:
            status, answer = 404, {"error": {"message": str(exc), "code": 404}}
        except Exception as exc:  # noqa: BLE001 - a test server answers every failure with its message
            status, answer = 400, {"error": repr(exc)}
        text = isinstance(answer, str)
        data = b"" if answer is None else answer.encode() if text else json.dumps(answer).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "text/plain" if text else "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _reload(self, body: dict) -> None:
        from safetensors.torch import load_file

        assert body["method"] == "reload_weights", body
        directory = Path(body["kwargs"]["weights_path"])
        weights = {}
        for file in sorted(directory.glob("*.safetensors")):
            weights.update(load_file(str(file)))
        with self.lock:
            missing, unexpected = self.model.load_state_dict(weights, strict=False)
            if unexpected or [m for m in missing if "lm_head" not in m]:
                raise ValueError(f"reload_weights: missing {missing}, unexpected {unexpected}")
            self.model.tie_weights()
            self.reloads.append(str(directory))

    def _adapter_call(self, path: str, body: dict) -> tuple[int, Any]:
        """vLLM's answers: 400 for a request without its fields or a name already loaded, 404 for an unknown one."""
        name = body.get("lora_name")
        if path == "/v1/unload_lora_adapter":
            if name not in self.adapters:
                return 404, {"error": {"message": f"The lora adapter '{name}' cannot be found.", "code": 404}}
            with self.lock:
                del self.adapters[name]
            return 200, f"Success: LoRA adapter '{name}' removed successfully."
        if not name or not body.get("lora_path"):
            return 400, {"error": {"message": "Both 'lora_name' and 'lora_path' must be provided.", "code": 400}}
        if name in self.adapters:
            return 400, {"error": {"message": f"The lora adapter '{name}' has already been loaded.", "code": 400}}
        if self.fail_lora_loads > 0:
            self.fail_lora_loads -= 1
            return 500, {"error": {"message": "loading the adapter failed", "code": 500}}
        import copy

        import peft

        with self.lock:
            base = copy.deepcopy(self.model)
        merged = peft.PeftModel.from_pretrained(base, body["lora_path"]).merge_and_unload().eval()
        with self.lock:
            self.adapters[name] = (body["lora_path"], merged)
            self.adapter_loads.append(name)
        return 200, f"Success: LoRA adapter '{name}' added successfully."

    @torch.no_grad()
    def _complete(self, body: dict) -> dict:
        prompt = body["prompt"]
        assert isinstance(prompt, list) and all(isinstance(t, int) for t in prompt), "token-id prompts only"
        assert body.get("return_tokens_as_token_ids"), "the backend reads token ids"
        temperature = float(body.get("temperature", 1.0))
        top_k, top_p = int(body.get("top_k", -1)), float(body.get("top_p", 1.0))
        stop = set(body.get("stop_token_ids") or [])
        allowed = body.get("allowed_token_ids")
        generator = torch.Generator().manual_seed(int(body.get("seed", 0)))
        if self.delay_s:
            time.sleep(self.delay_s)
        ids, logps = [], []
        with self.lock:
            name = body.get("model", self.model_dir)
            if name != self.model_dir and name not in self.adapters:
                raise LookupError(f"The model `{name}` does not exist.")
            model = self.model if name == self.model_dir else self.adapters[name][1]
            self.completions += 1
            sequence = list(prompt)
            for _ in range(int(body["max_tokens"])):
                # the whole sequence each token (tiny models, a few tokens): no cache argument, whose name
                # transformers changed between the oldest supported version and the newest
                logits = model(input_ids=torch.tensor([sequence]), use_cache=False).logits[0, -1].float()
                if allowed is not None:
                    blocked = torch.ones_like(logits, dtype=torch.bool)
                    blocked[allowed] = False
                    logits = logits.masked_fill(blocked, float("-inf"))
                if temperature == 0.0:
                    token = int(logits.argmax())
                    processed = logits.log_softmax(-1)
                else:
                    processed = _truncate(logits / temperature, top_k, top_p).log_softmax(-1)
                    token = int(torch.multinomial(processed.exp(), 1, generator=generator))
                ids.append(token)
                logps.append(float(processed[token]))
                if token in stop:
                    break
                sequence.append(token)
        return {"choices": [{"index": 0, "text": "", "logprobs": {
            "tokens": [f"token_id:{t}" for t in ids], "token_logprobs": logps}}]}


def _truncate(scores: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k > 0:
        kth = scores.topk(min(top_k, scores.numel())).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = scores.sort(descending=True)
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop = cumulative - ordered.softmax(-1) >= top_p
        scores = scores.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return scores


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-s", type=float, default=0.0)
    args = parser.parse_args()
    server = FakeVLLMServer(args.model, args.port, args.delay_s).start()
    print(f"fake vLLM server at {server.url}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
