"""loss_type sft_loss: the torch trainer's SFT loss equals the negative log-likelihood of the response tokens computed
here by hand from a Hugging Face model's logits, averaged as slime's sft_loss_function averages it (per-sample token
means summed over the global batch and divided by its sample count; with calculate_per_token_loss, the token sum over
the token count), within 1e-6; and an SFT step lowers that loss."""

import json
import os
import tempfile
import unittest

import numpy as np
from helpers import make_batch, require, step_in_process

require("torch", "transformers")

TINY_QWEN2 = {
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 300,
    "max_position_embeddings": 128,
    "tie_word_embeddings": True,
}


def save_base(path: str) -> None:
    """A random-init Qwen2 directory in float32 (the hand computation reads the same weights the trainer trains)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**TINY_QWEN2))
    model.to(torch.float32).save_pretrained(path)
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"model_max_length": 128}, f)


def hand_loss(model_dir: str, samples, per_token: bool) -> float:
    """-sum_of_sample_mean(log p(response token)) from transformers' own forward, one sample at a time, float64 sums."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    per_sample = []
    with torch.no_grad():
        for s in samples:
            ids = torch.from_numpy(s.tokens.astype(np.int64))[None]
            logits = model(ids).logits[0].to(torch.float64)
            logp_all = torch.log_softmax(logits, dim=-1)
            p, r = s.prompt_length, s.response_length
            # The token at position p + t is predicted by the logits at position p + t - 1.
            target = ids[0, p : p + r]
            logp = logp_all[p - 1 : p + r - 1].gather(1, target[:, None])[:, 0]
            mask = torch.from_numpy(s.loss_mask.astype(np.float64))
            per_sample.append(((logp * mask).sum().item(), mask.sum().item()))
    if per_token:
        tokens = sum(max(n, 1.0) for _, n in per_sample)
        return -sum(x for x, _ in per_sample) / tokens
    return -sum(x / max(n, 1.0) for x, n in per_sample) / len(per_sample)


def sft_step(trainer, model_uri: str, out: str, batch, step: int, **config):
    cfg = {"lr": 1e-3, "loss_type": "sft_loss", **config}
    return step_in_process(
        trainer, batch, cfg, out, step=step, checkpoint_uri=model_uri
    )


class SftLossTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.base = os.path.join(cls.tmp.name, "base")
        save_base(cls.base)
        # 6 groups of 1 (SFT: one response per row), ragged, some tokens masked (helpers.make_batch masks token 1).
        cls.batch = make_batch("sft", 0, groups=6, per_group=1, seed=3, vocab=258)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def check(self, per_token: bool, **config):
        from rlq_torch.trainer import TorchTrainer

        self.assertTrue(
            any(s.loss_mask.min() == 0 for s in self.batch.samples),
            "the batch must mask some tokens",
        )
        out = os.path.join(self.tmp.name, f"out-{per_token}-{len(config)}")
        res = sft_step(
            TorchTrainer("cpu"),
            "file://" + self.base,
            out,
            self.batch,
            0,
            calculate_per_token_loss=per_token,
            **config,
        )
        want = hand_loss(
            self.base,
            sorted(self.batch.samples, key=lambda s: (s.group_index, s.sample_index)),
            per_token,
        )
        self.assertGreater(want, 1.0)  # a random-init model: about log(300) per token
        self.assertAlmostEqual(res["metrics"]["loss"], want, delta=1e-6)
        self.assertNotIn("pg_loss", res["metrics"])
        return res, out

    def test_sample_mean_loss_equals_the_hand_computation(self):
        self.check(per_token=False)

    def test_per_token_loss_equals_the_hand_computation(self):
        self.check(per_token=True)

    def test_micro_batches_and_optimizer_steps_keep_the_loss(self):
        """Several micro-batches (max_tokens_per_gpu) add up to the global batch's loss."""
        self.check(per_token=False, max_tokens_per_gpu=24)

    def test_a_step_lowers_the_loss(self):
        res, out = self.check(per_token=False, lr=1e-2)
        want_after = hand_loss(
            out,
            sorted(self.batch.samples, key=lambda s: (s.group_index, s.sample_index)),
            False,
        )
        self.assertLess(want_after, res["metrics"]["loss"] - 0.05)

    def test_an_unknown_loss_type_is_refused(self):
        from rlq_torch.trainer import parse_algorithm

        with self.assertRaisesRegex(Exception, "loss_type"):
            parse_algorithm({"loss_type": "sft"})


if __name__ == "__main__":
    unittest.main()
