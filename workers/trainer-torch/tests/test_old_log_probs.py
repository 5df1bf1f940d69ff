"""A train step's result carries each sample's old log-probs (its response tokens', under the start
weights), in the request's order, and they are what a plain transformers forward of the start model
gives: rlq stores them per sample (train_log_probs) for the viewer's train − rollout colouring."""

import os
import tempfile
import unittest

import numpy as np
from helpers import make_batch, require, step_in_process

require("torch", "transformers")

from test_hf import TINY_QWEN2, save_base  # noqa: E402


class OldLogProbsTest(unittest.TestCase):
    def test_result_old_log_probs_match_a_transformers_forward_in_request_order(self):
        import torch
        from rlq_torch.batch import Batch
        from rlq_torch.trainer import TorchTrainer
        from transformers import AutoModelForCausalLM

        with tempfile.TemporaryDirectory() as d:
            base = os.path.join(d, "base")
            save_base(TINY_QWEN2, base)
            made = make_batch("old", 0, groups=2, per_group=3, seed=3)
            # Not in (group, sample) order: the result must follow the request, not the step's sort.
            batch = Batch(made.run_id, made.step, list(reversed(made.samples)))
            res = step_in_process(
                TorchTrainer("cpu"),
                batch,
                {"lr": 1e-3},
                os.path.join(d, "v1"),
                checkpoint_uri="file://" + base,
            )
            got = res["old_log_probs"]
            self.assertEqual(len(got), len(batch.samples))

            model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
            model.eval()
            for i, s in enumerate(batch.samples):
                tokens = torch.tensor(s.tokens, dtype=torch.long)[None]
                with torch.no_grad():
                    logp = torch.log_softmax(model(tokens).logits[0].float(), dim=-1)
                p = s.prompt_length
                # Token t is predicted at position t - 1.
                want = logp[p - 1 : -1].gather(1, tokens[0, p:, None])[:, 0].numpy()
                self.assertEqual(len(got[i]), len(want), f"sample {i}")
                np.testing.assert_allclose(
                    got[i], want, atol=2e-4, err_msg=f"sample {i}"
                )


if __name__ == "__main__":
    unittest.main()
