"""Tensor parallel (DTensor parallelize_module) and its 2-D composition with FSDP2 on gloo ranks, against one rank.

A tiny random Qwen2 (width 64, 2 layers, 4 query and 2 key/value heads) trains 3 AdamW steps on 1 rank in
this process and on 2 or 4 torchrun ranks (rlq_torch/tp_train.py): the loss and every whole gradient agree
within 1e-5 at every step. A checkpoint written at TP=2 (DCP, sharded) loads at TP=1 into exactly the
weights TP=2 gathered for the engines, and its optimizer state resumes the same next step.

Context parallel cannot run on CPU in torch 2.13 (its ring attention covers the CUDA SDPA kernels only):
the refusal is tested here, and so is torch's own failure when the check is bypassed, so this test fails
when a torch release makes CP run on CPU. CP's parity runs on a GPU (bench_tp.py, docs/trainer-torch.md).
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from helpers import ROOT, require

require("torch", "transformers", "safetensors")

import torch  # noqa: E402

ATOL = 1e-5
STEPS = 3


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

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.tmp, name)

    def assert_like_one_rank(self, got: dict, label: str):
        ref = self.ref
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

    def test_tp2_with_sequence_parallel_equals_one_rank(self):
        self.assert_like_one_rank(
            self.run_ranks(2, "sp2", "--tp", "2", "--sequence-parallel"), "TP=2 SP"
        )

    def test_tp2_with_fsdp2_on_a_2d_mesh_of_4_ranks_equals_one_rank(self):
        self.assert_like_one_rank(
            self.run_ranks(4, "tp2dp2", "--tp", "2", "--fsdp"), "TP=2 x FSDP2 dp=2"
        )

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


if __name__ == "__main__":
    unittest.main()
