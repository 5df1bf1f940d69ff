"""--trainer-checkpoint dcp: the optimizer state saved asynchronously through torch.distributed.checkpoint, resumed exactly."""

import os
import shutil
import tempfile
import unittest

from helpers import make_batch, require

require("torch")

import torch
from rlq_torch.models import CheckpointError
from rlq_torch.safetensors_io import read_metadata, read_safetensors
from rlq_torch.trainer import TorchTrainer
from rlq_torch.trainer_checkpoint import DCP_DIR
from test_device_loss import run_step
from test_trainer import req


class DcpCheckpointTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def steps(self, fmt: str, executor: str = "thread", tag: str = ""):
        """Step 0, then step 1 by a fresh trainer from step 0's directory (weights and optimizer state from disk);
        returns step 1's metrics."""
        b0, b1 = make_batch("r", 0, seed=1), make_batch("r", 1, seed=2)
        d = f"{self.dir}/{fmt}{tag}"
        first = TorchTrainer("cpu", checkpoint_format=fmt, dcp_executor=executor)
        run_step(first, req("r", 0, f"{d}0", weight_decay=0.1), b0)
        first.async_ckpt.wait()
        second = TorchTrainer("cpu", checkpoint_format=fmt, dcp_executor=executor)
        metrics = run_step(
            second,
            req("r", 1, f"{d}1", uri=f"file://{d}0", weight_decay=0.1),
            b1,
        )["metrics"]
        second.async_ckpt.wait()
        return metrics

    def test_resume_from_a_dcp_checkpoint_equals_resume_from_the_files(self):
        self.steps("safetensors")
        self.steps("dcp")
        self.assertFalse(os.path.exists(f"{self.dir}/dcp0/optimizer.safetensors"))
        self.assertTrue(os.path.isfile(f"{self.dir}/dcp0/{DCP_DIR}/.metadata"))
        self.assertEqual(
            read_metadata(f"{self.dir}/dcp1/weights.safetensors")["rlq_optimizer"],
            "dcp",
        )
        _, a = read_safetensors(f"{self.dir}/safetensors1/weights.safetensors")
        _, b = read_safetensors(f"{self.dir}/dcp1/weights.safetensors")
        for n in a:
            self.assertTrue(torch.equal(a[n], b[n]), n)

    def test_the_checkpoint_daemon_writes_what_the_thread_writes(self):
        """--dcp-executor process: DCP's daemon (a process of its own, on a group of one) writes the same state, the
        resume from it is the same, and the step reports its save's parts."""
        import torch.distributed as dist

        self.addCleanup(lambda: dist.is_initialized() and dist.destroy_process_group())
        self.steps("dcp")
        metrics = self.steps("dcp", "process", tag="p")
        self.assertTrue(os.path.isfile(f"{self.dir}/dcpp0/{DCP_DIR}/.metadata"))
        _, a = read_safetensors(f"{self.dir}/dcp1/weights.safetensors")
        _, b = read_safetensors(f"{self.dir}/dcpp1/weights.safetensors")
        for n in a:
            self.assertTrue(torch.equal(a[n], b[n]), n)
        for k in ("save_wait_s", "save_stage_s", "save_weights_s"):
            self.assertGreaterEqual(metrics[k], 0.0, k)
        with self.assertRaises(ValueError):
            TorchTrainer("cpu", checkpoint_format="dcp", dcp_executor="fork")

    def test_an_unfinished_dcp_save_fails_the_load_by_name(self):
        """The trainer stopped while the optimizer state was being written: its directory has no .metadata (written last),
        and a resume from it refuses (version_unavailable) instead of starting with zero moments."""
        b0, b1 = make_batch("r", 0, seed=1), make_batch("r", 1, seed=2)
        t = TorchTrainer("cpu", checkpoint_format="dcp")
        run_step(t, req("r", 0, f"{self.dir}/s0"), b0)
        t.async_ckpt.wait()
        os.remove(f"{self.dir}/s0/{DCP_DIR}/.metadata")
        with self.assertRaises(CheckpointError) as e:
            run_step(
                TorchTrainer("cpu", checkpoint_format="dcp"),
                req("r", 1, f"{self.dir}/s1", uri=f"file://{self.dir}/s0"),
                b1,
            )
        self.assertIn("incomplete", str(e.exception))
        shutil.rmtree(
            f"{self.dir}/s0/{DCP_DIR}"
        )  # no directory at all: the weights' marker still says there must be one
        with self.assertRaises(CheckpointError):
            run_step(
                TorchTrainer("cpu", checkpoint_format="dcp"),
                req("r", 1, f"{self.dir}/s1", uri=f"file://{self.dir}/s0"),
                b1,
            )


if __name__ == "__main__":
    unittest.main()
