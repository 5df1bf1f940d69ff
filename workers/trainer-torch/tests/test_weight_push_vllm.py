"""trainer_push into vLLM (rlq_torch/weight_push.py VllmNcclPusher): on a machine without CUDA the
pusher refuses before any call, naming the weight transfer backends vLLM 0.32.0 registers and why
none runs on CPU; with CUDA it goes past that gate to the engine's /get_world_size, the first call
of vLLM's NCCL handshake (here to an address nothing listens on, so the call itself fails by name).
The transfer end to end needs vLLM's CUDA build and a GPU server: this file is the gate both ways."""

import socket
import unittest
from types import SimpleNamespace

from helpers import require

require("torch")

import torch
from rlq_torch.weight_push import (
    VLLM_CPU_REFUSAL,
    PushError,
    VllmNcclPusher,
    pusher_from_args,
)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmPushGateTest(unittest.TestCase):
    def test_the_gate(self) -> None:
        url = f"http://127.0.0.1:{closed_port()}"
        pusher = VllmNcclPusher(
            [url], master_address="127.0.0.1", master_port=closed_port(), api_key="k"
        )
        with self.assertRaises(PushError) as caught:
            pusher.push([("w", torch.ones(2, 2))], 3)
        if torch.cuda.is_available():
            self.assertIn(f"GET {url}/get_world_size", str(caught.exception))
        else:
            self.assertEqual(str(caught.exception), VLLM_CPU_REFUSAL)
            for backend in (
                "nccl",
                "sparse_nccl",
                "nccl_m2n",
                "ipc",
                "sharded_rdt",
                "modelexpress",
            ):
                self.assertIn(backend, VLLM_CPU_REFUSAL)
            self.assertIn("weight_sync: disk", VLLM_CPU_REFUSAL)

    def test_the_server_flags_pick_it(self) -> None:
        args = SimpleNamespace(
            push_engines="http://127.0.0.1:1,http://127.0.0.1:2",
            push_via="vllm-nccl",
            push_master_address="127.0.0.1",
            push_master_port=29700,
        )
        pusher = pusher_from_args(args, "k")
        self.assertIsInstance(pusher, VllmNcclPusher)
        self.assertEqual(
            [c.url for c in pusher.clients],
            ["http://127.0.0.1:1", "http://127.0.0.1:2"],
        )

    def test_no_engine(self) -> None:
        with self.assertRaises(PushError):
            VllmNcclPusher([], master_address="127.0.0.1", master_port=1)


if __name__ == "__main__":
    unittest.main()
