"""A vLLM logits processor that paces the engine: it sleeps RLQ_VLLM_STEP_PACE_MS before every forward pass.

For the tests that cut a request while it runs (test/integration/real-vllm*.test.ts). On a 2-core machine the
fixture model decodes a thousand tokens in about a second, and vLLM's CPU engine keeps every core busy meanwhile,
so the test process, and vLLM's own API server that streams the tokens out, get the CPU only after the request
has ended: a cut "once running" lands after the last token. Paced, the engine core sleeps between steps, its
tokens stream out as they are made, and a cut sent at the first streamed token lands mid-request however loaded
the machine is. Nothing else changes: the logits pass through untouched (argmax-invariant, so vLLM skips apply()
for greedy requests), and sampling, log-probs, pause, abort and weight loads are the server's own.

Loaded with `--logits-processors vllm_step_pace:StepPace` (this directory on PYTHONPATH). vLLM calls update_state
once per step, before the forward pass (vllm/v1/worker/gpu_input_batch.py refresh_metadata, which the CPU model
runner shares); the interface is vllm/v1/sample/logits_processor/interface.py.
"""

import os
import time

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

PACE_S = float(os.environ.get("RLQ_VLLM_STEP_PACE_MS", "0")) / 1000.0


class StepPace(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.pace_s = PACE_S

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if self.pace_s > 0:
            time.sleep(self.pace_s)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits
