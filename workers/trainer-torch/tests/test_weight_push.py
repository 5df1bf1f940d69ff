"""trainer_push for real: rank 0 (this process) pushes tensors over torch.distributed (gloo, CPU) into a
receiver process that plays an SGLang engine (fake_push_engine.py), the way SGLang expects them."""

import json
import os
import socket
import subprocess
import sys
import unittest
import urllib.request

from helpers import require

require("torch")

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WeightPushTest(unittest.TestCase):
    """One stand-in engine (a process importing torch) for every test, with an API key; each test starts from
    an empty record of what it received."""

    KEY = "push-key-1"

    @classmethod
    def setUpClass(cls):
        cls.proc = subprocess.Popen(
            [
                sys.executable,
                os.path.join(HERE, "fake_push_engine.py"),
                "--port",
                "0",
                "--api-key",
                cls.KEY,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        line = cls.proc.stdout.readline()
        if not line.startswith("listening "):
            cls.tearDownClass()
            raise RuntimeError(f"the stand-in engine did not start: {line!r}")
        cls.url = f"http://127.0.0.1:{line.split()[1]}"

    @classmethod
    def tearDownClass(cls):
        cls.proc.kill()
        cls.proc.wait()
        cls.proc.stdout.close()

    def start_engine(self):
        rq = urllib.request.Request(
            f"{self.url}/reset_received",
            data=b"{}",
            method="POST",
            headers={
                "content-type": "application/json",
                "authorization": f"Bearer {self.KEY}",
            },
        )
        with urllib.request.urlopen(rq, timeout=30):
            pass
        return self.url

    def received(self, url):
        with urllib.request.urlopen(f"{url}/received", timeout=30) as r:
            return json.loads(r.read())

    def tensors(self):
        import torch

        g = torch.Generator().manual_seed(7)
        return [
            ("model.embed_tokens.weight", torch.randn(11, 4, generator=g)),
            (
                "model.layers.0.mlp.up_proj.weight",
                torch.randn(8, 4, generator=g).to(torch.bfloat16),
            ),
            ("model.layers.0.input_layernorm.weight", torch.randn(4, generator=g)),
            ("lm_head.weight", torch.randn(11, 4, generator=g).half()),
        ]

    def test_distributed_push_lands_every_tensor_inside_pause_and_continue(self):
        import torch
        from rlq_torch.weight_push import DistributedPusher

        key = self.KEY
        engine = self.start_engine()
        sent = self.tensors()
        pusher = DistributedPusher(
            [engine],
            master_address="127.0.0.1",
            master_port=free_port(),
            backend="gloo",
            api_key=key,
            timeout_s=60,
            bucket_bytes=200,
        )
        try:
            out = pusher.push(sent, version=3)
        finally:
            pusher.close()
        self.assertGreater(out["buckets"], 1)
        got = self.received(engine)
        self.assertEqual(got["version"], "3")
        calls = got["calls"]
        self.assertEqual(
            calls[:3], ["init_weights_update_group", "pause_generation", "flush_cache"]
        )
        self.assertEqual(calls[-1], "continue_generation")
        self.assertEqual(set(calls[3:-1]), {"update_weights_from_distributed"})
        self.assertEqual(len(calls[3:-1]), out["buckets"])
        for name, t in sent:
            r = got["tensors"][name]
            self.assertEqual(r["shape"], list(t.shape), name)
            # gloo has no bfloat16 broadcast: bf16 travels as float32, exactly.
            self.assertEqual(
                r["dtype"],
                str(torch.float32 if t.dtype == torch.bfloat16 else t.dtype),
                name,
            )
            self.assertEqual(r["values"], t.double().flatten().tolist(), name)

    def test_the_server_hook_pushes_the_held_version_and_reports_a_failure_without_raising(
        self,
    ):
        import types

        from rlq_torch.weight_push import DistributedPusher, push_held

        engine = self.start_engine()
        sent = self.tensors()
        trainer = types.SimpleNamespace(
            held=types.SimpleNamespace(
                version=4, policy=types.SimpleNamespace(named_params=lambda: sent)
            )
        )
        pusher = DistributedPusher(
            [engine],
            master_address="127.0.0.1",
            master_port=free_port(),
            backend="gloo",
            api_key=self.KEY,
            timeout_s=60,
        )
        try:
            out = push_held(pusher, trainer, 4, log=lambda m: None)
        finally:
            pusher.close()
        self.assertEqual(out["tensors"], len(sent))
        self.assertEqual(self.received(engine)["version"], "4")
        self.assertIn(
            "no weights of version 5",
            push_held(pusher, trainer, 5, log=lambda m: None)["error"],
        )
        dead = DistributedPusher(
            ["http://127.0.0.1:9"],
            master_address="127.0.0.1",
            master_port=free_port(),
            backend="gloo",
            timeout_s=5,
        )
        self.assertIn(
            "POST http://127.0.0.1:9/init_weights_update_group",
            push_held(dead, trainer, 4, log=lambda m: None)["error"],
        )

    def test_a_wrong_key_fails_the_push_with_the_answer(self):
        from rlq_torch.weight_push import PushError, push_from_tensor

        engine = self.start_engine()
        with self.assertRaises(PushError) as e:
            push_from_tensor(engine, self.tensors(), 1, api_key="wrong", timeout_s=30)
        self.assertIn("HTTP 401", str(e.exception))

    def test_the_push_key_is_the_admin_key_where_one_is_named(self):
        """SGLang with --admin-api-key takes only it on the push routes (utils/auth.py decide_request_auth)."""
        import types

        from rlq_torch.weight_push import PushError, push_api_key

        args = types.SimpleNamespace(
            push_api_key_env="K_USER", push_admin_api_key_env="K_ADMIN"
        )
        self.assertEqual(push_api_key(args, {"K_USER": "u", "K_ADMIN": "a"}), "a")
        with self.assertRaisesRegex(PushError, "--push-admin-api-key-env K_ADMIN"):
            push_api_key(args, {"K_USER": "u"})
        self.assertEqual(
            push_api_key(
                types.SimpleNamespace(
                    push_api_key_env="K_USER", push_admin_api_key_env=None
                ),
                {"K_USER": "u"},
            ),
            "u",
        )
        self.assertIsNone(push_api_key(types.SimpleNamespace(), {}))

    def test_same_host_push_from_tensor(self):
        from rlq_torch.weight_push import push_from_tensor

        engine = self.start_engine()
        sent = [
            (n, t) for n, t in self.tensors() if t.dtype != __import__("torch").bfloat16
        ]
        push_from_tensor(engine, sent, 5, api_key=self.KEY, timeout_s=60)
        got = self.received(engine)
        self.assertEqual(got["version"], "5")
        self.assertEqual(
            got["calls"],
            [
                "pause_generation",
                "flush_cache",
                "update_weights_from_tensor",
                "continue_generation",
            ],
        )
        for name, t in sent:
            self.assertEqual(
                got["tensors"][name]["values"], t.double().flatten().tolist(), name
            )

    def test_the_server_flags_choose_the_same_host_pusher(self):
        import argparse

        from rlq_torch.weight_push import TensorPusher, pusher_from_args

        engine = self.start_engine()
        args = argparse.Namespace(
            push_engines=engine,
            push_via="tensor",
            push_tp_size=2,
            push_master_address="127.0.0.1",
            push_master_port=0,
            push_backend="gloo",
        )
        pusher = pusher_from_args(args, self.KEY)
        self.assertIsInstance(pusher, TensorPusher)
        sent = [
            (n, t) for n, t in self.tensors() if t.dtype != __import__("torch").bfloat16
        ]
        out = pusher.push(sent, 7)
        self.assertEqual(out["via"], "tensor")
        got = self.received(engine)
        self.assertEqual(got["version"], "7")
        self.assertEqual(
            got["calls"],
            [
                "pause_generation",
                "flush_cache",
                "update_weights_from_tensor",
                "continue_generation",
            ],
        )
        for name, t in sent:
            self.assertEqual(
                got["tensors"][name]["values"], t.double().flatten().tolist(), name
            )

    def test_a_train_step_pushes_via_tensor_and_is_done(self):
        """server.py --push-via tensor end to end: the step trains, pushes, logs the push and answers done, with the
        engine holding the committed weights (the log line once read a key only the distributed pusher returns)."""
        import tempfile

        from helpers import BatchServer, TrainerProcess, make_batch, request
        from rlq_torch.safetensors_io import read_safetensors

        engine = self.start_engine()
        batches = BatchServer()
        trainer = TrainerProcess(
            "--push-engines",
            engine,
            "--push-via",
            "tensor",
            "--push-api-key-env",
            "RLQ_TEST_PUSH_KEY",
            env={"RLQ_TEST_PUSH_KEY": self.KEY},
        )
        try:
            with tempfile.TemporaryDirectory() as out:
                url = batches.add("tensor-0", make_batch("tensor", 0, seed=1))
                code, st = trainer.call(
                    "POST", "/v1/steps", request("tensor", 0, "1", out, url)
                )
                self.assertEqual(code, 202, st)
                done = trainer.wait("tensor", 0)
                self.assertEqual(done["state"], "done", done)
                push = done["result"]["weight_push"]
                self.assertNotIn("error", push)
                self.assertEqual(
                    (push["version"], push["via"], push["engines"]),
                    (1, "tensor", [engine]),
                )
                # The push is a phase of the step's time split, which still sums to the step's wall time.
                from rlq_torch.efficiency import SPLIT_KEYS

                m = done["result"]["metrics"]
                self.assertGreater(m["push_s"], 0.0)
                self.assertLessEqual(
                    abs(sum(m[k] for k in SPLIT_KEYS) - m["step_s"]),
                    0.05 * m["step_s"],
                    m,
                )
                got = self.received(engine)
                self.assertEqual(got["version"], "1")
                self.assertEqual(
                    got["calls"],
                    [
                        "pause_generation",
                        "flush_cache",
                        "update_weights_from_tensor",
                        "continue_generation",
                    ],
                )
                _, weights = read_safetensors(f"{out}/weights.safetensors")
                self.assertEqual(push["tensors"], len(weights))
                for name, t in weights.items():
                    self.assertEqual(
                        got["tensors"][name]["values"],
                        t.double().flatten().tolist(),
                        name,
                    )
        finally:
            trainer.close()
            batches.close()
        self.assertIn("pushed version 1:", trainer.stderr_text)


if __name__ == "__main__":
    unittest.main()
