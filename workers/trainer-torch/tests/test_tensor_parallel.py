"""Tensor parallel (DTensor parallelize_module) and its 2-D composition with FSDP2 on gloo ranks, against one rank.

A tiny random Qwen2 or Llama (width 64, 2 layers, 4 query and 2 key/value heads) trains 3 AdamW steps on 1 rank in
this process and on 2 or 4 torchrun ranks (rlq_torch/tp_train.py): the loss and every whole gradient agree
within 1e-5 at every step. A checkpoint written at TP=2 (DCP, sharded) loads at TP=1 into exactly the
weights TP=2 gathered for the engines, and its optimizer state resumes the same next step.

Context parallel cannot run on CPU in torch 2.13 (its ring attention covers the CUDA SDPA kernels only):
the refusal is tested here, and so is torch's own failure when the check is bypassed, so this test fails
when a torch release makes CP run on CPU. CP's parity runs on a GPU (bench_tp.py, docs/trainer-torch.md).
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest
import urllib.request

from helpers import ROOT, TINY_MODEL, make_batch, request, require

require("torch", "transformers", "safetensors")

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ATOL = 1e-5
STEPS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(n: int, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(n),
            "-m",
            "rlq_torch.tp_train",
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    if check and r.returncode != 0:
        raise AssertionError(f"torchrun {n} ranks {args} failed:\n{r.stderr[-6000:]}")
    return r


def one_rank(*args: str) -> dict:
    from rlq_torch import tp_train

    with tempfile.TemporaryDirectory() as d:
        tp_train.main([*args, "--out", os.path.join(d, "r.pt")])
        return torch.load(os.path.join(d, "r.pt"))


class TensorParallelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="rlq-tp-test-")
        cls.ref = one_rank("--keep-grads", "--steps", str(STEPS))
        cls.ref_llama = one_rank(
            "--keep-grads", "--steps", str(STEPS), "--arch", "llama"
        )

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.tmp, name)

    def assert_like_one_rank(self, got: dict, label: str, ref: dict | None = None):
        ref = ref or self.ref
        self.assertEqual(len(got["losses"]), STEPS)
        for s in range(STEPS):
            self.assertLess(
                abs(got["losses"][s] - ref["losses"][s]),
                ATOL,
                f"{label}: loss at step {s}",
            )
            self.assertEqual(
                set(got["grads"][s]), set(ref["grads"][s]), f"{label}: parameter names"
            )
            for n, g in ref["grads"][s].items():
                self.assertEqual(
                    tuple(got["grads"][s][n].shape),
                    tuple(g.shape),
                    f"{label}: {n} shape",
                )
                diff = float((got["grads"][s][n] - g).abs().max())
                self.assertLess(
                    diff,
                    ATOL,
                    f"{label}: gradient of {n} at step {s} differs by {diff}",
                )

    def run_ranks(self, n: int, name: str, *args: str) -> dict:
        out = self.path(f"{name}.pt")
        torchrun(n, "--keep-grads", "--steps", str(STEPS), "--out", out, *args)
        return torch.load(out)

    def test_tp2_equals_one_rank_and_its_checkpoint_resumes_at_tp1_byte_identically(
        self,
    ):
        dcp_dir, hf_dir = self.path("tp2.dcp"), self.path("tp2-hf")
        got = self.run_ranks(
            2, "tp2", "--tp", "2", "--save-dcp", dcp_dir, "--save-hf", hf_dir
        )
        self.assert_like_one_rank(got, "TP=2")

        # The whole weights the engines get (gathered from the TP shards) are the file on disk, byte for byte.
        from safetensors.torch import load_file

        hf = load_file(os.path.join(hf_dir, "model.safetensors"))
        self.assertEqual(set(hf), set(got["weights"]))
        for n, w in got["weights"].items():
            self.assertTrue(torch.equal(hf[n], w), n)

        # TP=1 resumes from TP=2's sharded checkpoint: DCP reshards every weight onto the one-rank model.
        resumed = one_rank("--resume-dcp", dcp_dir, "--steps", "0")
        for n, w in hf.items():
            self.assertEqual(resumed["weights"][n].dtype, w.dtype, n)
            self.assertEqual(
                resumed["weights"][n].numpy().tobytes(),
                w.numpy().tobytes(),
                f"{n} is not byte-identical at TP=1",
            )

        # The optimizer state reshards too: one more step from the checkpoint is the same at TP=1 and TP=2.
        at1 = one_rank("--resume-dcp", dcp_dir, "--steps", "1")
        at2 = self.path("tp2-resumed.pt")
        torchrun(2, "--tp", "2", "--resume-dcp", dcp_dir, "--steps", "1", "--out", at2)
        at2 = torch.load(at2)
        self.assertLess(abs(at1["losses"][0] - at2["losses"][0]), ATOL)
        for n, w in at1["weights"].items():
            self.assertLess(float((w - at2["weights"][n]).abs().max()), ATOL, n)
        # the moments came back (AdamW's step count is the checkpoint's), and that step moved the weights
        self.assertEqual(at1["resumed_step"], float(STEPS))
        self.assertEqual(at2["resumed_step"], float(STEPS))
        self.assertFalse(all(torch.equal(at1["weights"][n], hf[n]) for n in hf))

    def test_tp2_with_sequence_parallel_on_llama_equals_one_rank(self):
        got = self.run_ranks(
            2, "sp2", "--tp", "2", "--sequence-parallel", "--arch", "llama"
        )
        self.assert_like_one_rank(got, "Llama TP=2 SP", self.ref_llama)

    def test_tp2_x_fsdp2_on_4_ranks_equals_one_rank_and_rank_0_pushes_the_gathered_weights(
        self,
    ):
        """trainer_push from a 2-D mesh: every rank gathers the TP and FSDP shards, rank 0 broadcasts each whole
        tensor to the engine over the push group (fake_push_engine.py plays SGLang's side)."""
        engine = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "fake_push_engine.py"), "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            url = f"http://127.0.0.1:{engine.stdout.readline().split()[1]}"
            got = self.run_ranks(
                4,
                "tp2dp2",
                "--tp",
                "2",
                "--fsdp",
                "--push-engines",
                url,
                "--push-master-port",
                str(free_port()),
            )
            self.assert_like_one_rank(got, "TP=2 x FSDP2 dp=2")
            self.assertNotIn("error", got["push"])
            with urllib.request.urlopen(f"{url}/received", timeout=30) as r:
                received = json.loads(r.read())
        finally:
            engine.kill()
            engine.wait()
            engine.stdout.close()
        self.assertEqual(received["version"], str(STEPS))
        self.assertEqual(sorted(received["tensors"]), sorted(got["weights"]))
        for name, w in got["weights"].items():
            self.assertEqual(received["tensors"][name]["shape"], list(w.shape), name)
            self.assertEqual(
                received["tensors"][name]["values"],
                w.to(torch.float64).flatten().tolist(),
                name,
            )
        for name, w in self.ref["weights"].items():
            self.assertLess(float((got["weights"][name] - w).abs().max()), ATOL, name)

    def test_context_parallel_on_cpu_is_refused_and_torch_cannot_run_it(self):
        r = torchrun(2, "--cp", "2", "--steps", "1", check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("context_parallel_size > 1 needs CUDA", r.stderr)
        # Bypassing the check shows why: torch's ring attention has no CPU SDPA kernel. When a torch release
        # makes this pass, cp_unavailable() and this test should change (CP would then run in CI).
        r = torchrun(2, "--cp", "2", "--steps", "1", "--unchecked-cp", check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(
            "aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy",
            r.stderr,
        )


class ParallelDimsTest(unittest.TestCase):
    def test_bad_sizes_are_refused_by_name(self):
        from rlq_torch.tensor_parallel import ParallelDims, check_dims, check_model
        from rlq_torch.tp_train import make_model

        with self.assertRaisesRegex(
            ValueError,
            r"tensor_model_parallel_size \(2\) x context_parallel_size \(2\) must divide",
        ):
            check_dims(ParallelDims(world=2, tp=2, cp=2))
        with self.assertRaisesRegex(
            ValueError, "sequence_parallel needs tensor_model_parallel_size > 1"
        ):
            check_dims(ParallelDims(world=2, tp=1, sequence_parallel=True))
        model = make_model("llama", 1, 64, torch.device("cpu"))
        with self.assertRaisesRegex(
            ValueError, "must divide the model's num_attention_heads"
        ):
            check_model(model, ParallelDims(world=3, tp=3))
        self.assertEqual(ParallelDims(world=8, tp=2, cp=2).dp, 2)

    def test_the_step_config_keys_are_read_and_the_rl_step_refuses_sizes_it_cannot_split(
        self,
    ):
        from rlq_torch.tensor_parallel import ParallelSizes, step_refusal
        from rlq_torch.train_config import StepError, parse_train_config

        t = parse_train_config(
            {"tensor_model_parallel_size": 2, "sequence_parallel": True}, {}
        )
        self.assertEqual(t.parallel, ParallelSizes(tp=2, cp=1, sequence_parallel=True))
        self.assertEqual(parse_train_config({}, {}).parallel, ParallelSizes())
        for bad, msg in (
            (
                {"tensor_model_parallel_size": 0},
                "config.tensor_model_parallel_size = 0: expected a positive integer",
            ),
            ({"context_parallel_size": True}, "config.context_parallel_size = True"),
            (
                {"sequence_parallel": True},
                "sequence_parallel needs tensor_model_parallel_size > 1",
            ),
        ):
            with self.assertRaises(StepError) as e:
                parse_train_config(bad, {})
            self.assertIn(msg, str(e.exception))
        self.assertIsNone(step_refusal(ParallelSizes()))
        self.assertIn("data parallel only", step_refusal(ParallelSizes(tp=2)))


class TrainStepRefusalTest(unittest.TestCase):
    def test_a_step_asking_for_tp_is_refused_as_bad_request_before_it_trains(self):
        from rlq_torch.trainer import (
            StepError,
            TorchTrainer,
            parse_algorithm,
            parse_train_config,
        )

        batch = make_batch("r", 0)
        with tempfile.TemporaryDirectory() as out:
            r = request(
                "r",
                0,
                "0",
                out,
                "http://unused",
                {"seed": 7, "tensor_model_parallel_size": 2},
            )
            tr = TorchTrainer("cpu", {"model": TINY_MODEL})
            t = parse_train_config(r["config"], tr.defaults)
            with self.assertRaises(StepError) as e:
                tr.train_step(
                    r,
                    batch,
                    t,
                    parse_algorithm(r["config"]),
                    lambda *a: None,
                    lambda: None,
                )
            self.assertEqual(e.exception.code, "bad_request")
            self.assertIn("tensor_model_parallel_size 2", str(e.exception))
            self.assertEqual(os.listdir(out), [])


if __name__ == "__main__":
    unittest.main()
