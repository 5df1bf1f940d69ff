"""bench_gpu.py's CPU dry run: the GPU bench runs end to end on tiny shapes and writes the fields one GPU run is read for."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

from helpers import ROOT, require

require("torch", "transformers")


class BenchGpuDryRunTest(unittest.TestCase):
    def test_dry_run_writes_every_case_with_its_split_and_mfu(self):
        with tempfile.TemporaryDirectory() as out:
            env = {
                **os.environ,
                "RLQ_DEVICE_PEAK_TFLOPS": "1",
            }  # a CPU has no table entry: the env gives MFU a peak
            r = subprocess.run(
                [
                    sys.executable,
                    os.path.join(ROOT, "bench_gpu.py"),
                    "--out",
                    out,
                    "--dry-run",
                    "--steps",
                    "1",
                    "--budget-s",
                    "240",
                ],
                check=False,
                capture_output=True,
                text=True,
                env=env,
                timeout=300,
            )
            self.assertEqual(r.returncode, 0, r.stderr[-4000:])
            with open(os.path.join(out, "trainer-torch-gpu-bench.json")) as f:
                doc = json.load(f)
        self.assertTrue(doc["complete"], doc)
        self.assertTrue(doc["dry_run"])
        for key in (
            "device",
            "torch",
            "transformers",
            "attention",
            "peak_tflops",
            "target_tokens_per_s",
        ):
            self.assertIn(key, doc)
        self.assertEqual(
            [c["case"] for c in doc["results"]],
            ["qwen3-0.6b-16k", "qwen2-0.5b-512", "qwen3-0.6b-16k-mixed"],
        )
        for c in doc["results"]:
            self.assertNotIn("error", c, c)
            self.assertEqual(c["steps_measured"], 1, c)
            for key in (
                "tokens_per_s",
                "tflops",
                "mfu",
                "tokens_per_s_without_save",
                "split_median_s",
                "weights_dtype",
            ):
                self.assertIsNotNone(c.get(key), f"{c['case']}: {key}")
            self.assertEqual(
                c["weights_dtype"],
                "bfloat16",
                "the bench's models are bf16: so is the weights file",
            )
            split = c["split_median_s"]
            for key in (
                "old_logprobs_s",
                "fwd_bwd_s",
                "optimizer_s",
                "save_s",
                "push_s",
                "other_s",
            ):
                self.assertIn(key, split)
            self.assertGreater(split["fwd_bwd_s"], 0)
            self.assertAlmostEqual(c["split_sum_over_step"], 1.0, delta=0.05)
            self.assertAlmostEqual(
                c["mfu"], c["tflops"] / 1.0, delta=0.01 * c["tflops"] + 1e-9
            )


if __name__ == "__main__":
    unittest.main()
