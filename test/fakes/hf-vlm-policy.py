"""TEST STAND-IN — the model behind the fake SGLang (test/fakes/fake-sglang.ts --policy-url): a Hugging Face
vision-language model (Qwen2-VL style) that samples the tokens the fake answers with, so a run's rollout
log-probs are a real model's and the trainer's can be held against them.

Neither real server serves a Qwen2-VL here: SGLang is not installed, and vLLM's CPU build fails to load the
architecture without torchvision (docs/engines.md, "Images"). This process does what SGLang's scheduler does
with a request, read in python/sglang/srt/ of sgl-project/sglang:
- images: each `image_data` entry loaded as utils/common.py load_image does (a data: URI's base64, else a
  path), converted to RGB, and processed by the model's own image processor; each image placeholder
  (`<|image_pad|>`) of the input ids replaced by one token per merged patch, as the Qwen2-VL multimodal
  processor does (multimodal/processors/qwen_vl.py), so the model sees the same expanded prompt as the
  trainer (workers/trainer-torch/rlq_torch/vlm.py);
- sampling: temperature, then top-k and top-p (none when top_k is -1 and top_p 1); a greedy request
  (top_k 1 or temperature 0) takes the argmax (layers/sampler.py);
- log-probs: of each sampled token, log softmax(logits / temperature) over the whole vocabulary, SGLang's
  default (layers/sampler.py, without SGLANG_RETURN_ORIGINAL_LOGPROB), and log softmax(logits) on the
  greedy path;
- stops: the model's end-of-sequence token unless ignore_eos, and stop_token_ids; the stop token is kept.
It answers one request at a time, in arrival order (the fake forwards them), so a seeded request draws the
same tokens every time.

    .venv/bin/python test/fakes/hf-vlm-policy.py MODEL_DIR [--port 0]

POST /generate {input_ids, image_data, sampling_params, seed} -> {output_ids, output_logprobs, finish: stop|length};
POST /load {path}: the model directory's weights are replaced by the checkpoint's; GET /health.
Prints "listening PORT".
"""

import argparse
import base64
import io
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

import numpy as np
import torch

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(REPO, "workers", "trainer-torch"))

from rlq_torch.vlm import load_processor  # noqa: E402


def load_image(x: str):
    from PIL import Image

    if x.startswith("data:"):
        data = base64.b64decode(x.split(",", 1)[1])
        return Image.open(io.BytesIO(data)).convert("RGB")
    return Image.open(x).convert("RGB")


class Policy:
    def __init__(self, model_dir: str):
        from transformers import AutoModelForImageTextToText

        self.cls = AutoModelForImageTextToText
        self.proc = load_processor(model_dir)
        self.image_token_id = int(self.proc.image_token_id)
        self.merge = int(self.proc.image_processor.merge_size)
        self.model = self.cls.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.eos = int(self.model.config.text_config.eos_token_id)

    def load(self, path: str) -> None:
        self.model = self.cls.from_pretrained(path, dtype=torch.float32).eval()

    @torch.no_grad()
    def generate(self, ids: list[int], images: list[str], sp: dict, seed: int) -> dict:
        vision = {}
        ids_t = np.asarray(ids, dtype=np.int64)
        if images:
            out = self.proc.image_processor(
                images=[load_image(x) for x in images], return_tensors="pt"
            )
            grid = out["image_grid_thw"]
            counts = [int(g.prod()) // (self.merge * self.merge) for g in grid]
            where = np.flatnonzero(ids_t == self.image_token_id)
            if len(where) != len(images):
                raise ValueError(
                    f"{len(images)} image(s) for {len(where)} image placeholder(s)"
                )
            reps = np.ones(ids_t.shape[0], dtype=np.int64)
            reps[where] = counts
            ids_t = np.repeat(ids_t, reps)
            # mm_token_type_ids: 1 at image tokens, as the processor gives it; M-RoPE reads the images' spans from it.
            type_ids = torch.from_numpy(
                (ids_t == self.image_token_id).astype(np.int32)
            )[None]
            vision = {
                "pixel_values": out["pixel_values"],
                "image_grid_thw": grid,
                "mm_token_type_ids": type_ids,
            }
        temperature = float(sp.get("temperature", 1.0))
        top_k = int(sp.get("top_k", -1))
        top_p = float(sp.get("top_p", 1.0))
        is_greedy = top_k == 1 or temperature < 1e-5
        stops = set(sp.get("stop_token_ids") or [])
        if not sp.get("ignore_eos"):
            stops.add(self.eos)
        gen = torch.Generator().manual_seed(seed)
        input_ids = torch.from_numpy(ids_t)[None]
        out_ids: list[int] = []
        out_lps: list[float] = []
        past = None
        kwargs = dict(vision)
        cur = input_ids
        for _ in range(int(sp.get("max_new_tokens", 128))):
            # After the prefill the model places the new token by the cache's length and the prompt's
            # M-RoPE offset (rope_deltas, kept from the prefill), the path transformers' generate takes.
            step = self.model(
                input_ids=cur if past is None else cur[:, -1:],
                past_key_values=past,
                use_cache=True,
                **kwargs,
            )
            past = step.past_key_values
            kwargs = {}
            z = step.logits[0, -1].float()
            if is_greedy:
                tok = int(z.argmax())
                lp = float(torch.log_softmax(z, -1)[tok])
            else:
                scaled = z / temperature
                logp = torch.log_softmax(scaled, -1)
                probs = logp.exp()
                if top_k > 0:
                    kth = probs.topk(top_k).values[-1]
                    probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
                if top_p < 1.0:
                    sp_, order = probs.sort(descending=True)
                    keep = sp_.cumsum(0) - sp_ < top_p
                    mask = torch.zeros_like(probs, dtype=torch.bool)
                    mask[order[keep]] = True
                    probs = torch.where(mask, probs, torch.zeros_like(probs))
                tok = int(torch.multinomial(probs / probs.sum(), 1, generator=gen))
                lp = float(logp[tok])
            out_ids.append(tok)
            out_lps.append(lp)
            cur = torch.cat([cur, torch.tensor([[tok]])], 1)
            if tok in stops:
                return {
                    "output_ids": out_ids,
                    "output_logprobs": out_lps,
                    "finish": "stop",
                }
        return {"output_ids": out_ids, "output_logprobs": out_lps, "finish": "length"}


def serve(policy: Policy, port: int) -> None:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.answer(200, {"ok": True})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            try:
                if self.path == "/load":
                    policy.load(body["path"])
                    return self.answer(200, {"ok": True})
                if self.path == "/generate":
                    return self.answer(
                        200,
                        policy.generate(
                            body["input_ids"],
                            body.get("image_data") or [],
                            body.get("sampling_params") or {},
                            int(body.get("seed", 0)),
                        ),
                    )
                self.answer(404, {"error": self.path})
            except (ValueError, OSError) as e:
                self.answer(400, {"error": str(e)})

    class Server(HTTPServer):
        # The fake forwards every live request at once; http.server's backlog of 5 drops the rest of the
        # connections, which the client's TCP then retries after seconds.
        request_queue_size = 1024

    server = Server(("127.0.0.1", port), Handler)
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    serve(Policy(a.model), a.port)


if __name__ == "__main__":
    main()
