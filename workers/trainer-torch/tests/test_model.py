"""The embedded model in PyTorch matches rlq's: same initialisation, same forward, same files."""

import json
import os
import tempfile
import unittest

from helpers import ROOT, require

require("torch")

VECTORS = os.path.join(ROOT, "parity-vectors.json")


class EmbeddedModelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(VECTORS) as f:
            cls.ref = json.load(f)["model"]

    def policy(self, dtype):
        import torch
        from rlq_torch import gpt
        from rlq_torch.models import EmbeddedPolicy

        c = gpt.parse_model_config(self.ref["config"])
        p = EmbeddedPolicy(
            c, gpt.init_weights(c, self.ref["seed"]), torch.device("cpu")
        )
        p.module.to(dtype)
        return p

    def test_initialisation_is_rlqs(self):
        import torch
        from rlq_torch import gpt

        w = gpt.init_weights(
            gpt.parse_model_config(self.ref["config"]), self.ref["seed"]
        )
        for name, first in self.ref["init"].items():
            self.assertTrue(
                torch.equal(
                    w[name].reshape(-1)[:4], torch.tensor(first, dtype=torch.float32)
                ),
                name,
            )
        self.assertEqual(list(w), list(self.ref["init"]))  # canonical order

    def response_logprobs(self, policy, case):
        import numpy as np
        from rlq_torch.batch import Sample
        from rlq_torch.trainer import TorchTrainer

        toks = np.array(case["tokens"], dtype=np.int32)
        r = len(toks) - case["promptLength"]
        s = Sample(
            toks,
            case["promptLength"],
            np.ones(r, dtype=np.uint8),
            np.zeros(r, dtype=np.float32),
            np.zeros(r, dtype=np.int32),
            0.0,
            0,
            0,
        )
        lp, _ = TorchTrainer("cpu").token_stats(
            policy, [s], self.ref["temperature"], grad=False
        )
        return lp.double().tolist()

    def test_forward_matches_the_float64_reference(self):
        import torch

        p64 = self.policy(torch.float64)
        p32 = self.policy(torch.float32)
        for case in self.ref["cases"]:
            got64 = self.response_logprobs(p64, case)
            got32 = self.response_logprobs(p32, case)
            for e, a64, a32 in zip(case["logProbs"], got64, got32):
                self.assertAlmostEqual(a64, e, delta=1e-9)
                self.assertAlmostEqual(a32, e, delta=1e-4)

    def test_batched_padding_does_not_change_logprobs(self):
        import numpy as np
        import torch
        from rlq_torch.batch import Sample
        from rlq_torch.trainer import TorchTrainer

        p = self.policy(torch.float64)
        ss = []
        for case in self.ref["cases"]:
            toks = np.array(case["tokens"], dtype=np.int32)
            r = len(toks) - case["promptLength"]
            ss.append(
                Sample(
                    toks,
                    case["promptLength"],
                    np.ones(r, dtype=np.uint8),
                    np.zeros(r, dtype=np.float32),
                    np.zeros(r, dtype=np.int32),
                    0.0,
                    0,
                    0,
                )
            )
        lp, _ = TorchTrainer("cpu").token_stats(
            p, ss, self.ref["temperature"], grad=False
        )
        expected = [x for case in self.ref["cases"] for x in case["logProbs"]]
        for e, a in zip(expected, lp.tolist()):
            self.assertAlmostEqual(a, e, delta=1e-9)

    def test_writing_a_tensor_leaves_its_storage_resizable(self):
        """FSDP frees and re-allocates a gathered parameter by resizing its storage; Tensor.numpy() marks a storage
        not resizable, so the save of the gathered weights broke the reshard after it (torch 2.11, FSDP1 and FSDP2).
        The writer reads bytes without numpy: the same bytes, and the storage stays resizable."""
        import warnings

        import torch
        from rlq_torch.safetensors_io import read_safetensors, write_safetensors

        ts = [
            ("f", torch.randn(4, 3)),
            ("h", torch.randn(5).to(torch.bfloat16)),
            ("b", torch.tensor([True, False])),
            ("e", torch.zeros(0, 2)),
        ]
        with tempfile.TemporaryDirectory() as d:
            write_safetensors(os.path.join(d, "w.safetensors"), ts, {"k": "v"})
            _, back = read_safetensors(os.path.join(d, "w.safetensors"))
        for n, t in ts:
            self.assertTrue(torch.equal(back[n], t), n)
        with warnings.catch_warnings():
            warnings.simplefilter(
                "ignore"
            )  # TypedStorage is deprecated in torch 2; untyped_storage() is not in 1.13
            ts[0][1].storage().resize_(0)
        self.assertEqual(ts[0][1].storage().size(), 0)

    def test_checkpoint_round_trip_is_byte_identical(self):
        import torch
        from rlq_torch.models import WEIGHTS_FILE, load_policy

        p = self.policy(torch.float32)
        with tempfile.TemporaryDirectory() as d:
            p.save(d, 3, "run", 2)
            q = load_policy("file://" + d, torch.device("cpu"))
            for (n1, a), (n2, b) in zip(p.named_params(), q.named_params()):
                self.assertEqual(n1, n2)
                self.assertTrue(torch.equal(a, b))
            with tempfile.TemporaryDirectory() as d2:
                q.save(d2, 3, "run", 2)
                with (
                    open(os.path.join(d, WEIGHTS_FILE), "rb") as f1,
                    open(os.path.join(d2, WEIGHTS_FILE), "rb") as f2,
                ):
                    self.assertEqual(f1.read(), f2.read())


if __name__ == "__main__":
    unittest.main()
