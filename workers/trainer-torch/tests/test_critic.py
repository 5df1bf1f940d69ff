"""PPO with a critic (advantage_estimator: ppo): GAE from the critic's values, the clipped value loss,
critic checkpoints committed with the step, num_critic_only_steps."""

import tempfile
import unittest

import numpy as np
from helpers import TINY_MODEL, make_batch, require

require("torch")


def req(step, out, uri=None, **config):
    c = {
        "lr": 1e-3,
        "model": TINY_MODEL,
        "seed": 7,
        "advantage_estimator": "ppo",
        "value_clip": 0.5,
        "gamma": 1.0,
        "lambd": 0.95,
        **config,
    }
    return {
        "run_id": "r",
        "step": step,
        "attempt": "0",
        "weight_version_in": step,
        "checkpoint_uri_in": uri,
        "output_dir": out,
        "batch_url": "http://unused",
        "config": c,
    }


def read(path):
    with open(path, "rb") as f:
        return f.read()


class CriticTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def step(self, trainer, r, batch):
        from rlq_torch.trainer import parse_algorithm, parse_train_config

        return trainer.train_step(
            r,
            batch,
            parse_train_config(r["config"], {}),
            parse_algorithm(r["config"]),
            lambda *a: None,
            lambda: None,
        )

    def test_the_critic_learns_the_returns_and_is_committed_with_the_step(self):
        from rlq_torch.safetensors_io import read_metadata
        from rlq_torch.trainer import TorchTrainer

        tr = TorchTrainer("cpu")
        batch = make_batch("r", 0, groups=4, per_group=4, seed=3)
        losses = []
        uri = None
        for step in range(
            8
        ):  # the same batch every step (critic only): the value loss must fall
            batch.step = step
            out = f"{self.dir}/s{step}"
            res = self.step(
                tr,
                req(
                    step,
                    out,
                    uri,
                    critic_lr=3e-3,
                    lambd=1.0,
                    max_tokens_per_gpu=60,
                    num_critic_only_steps=100,
                ),
                batch,
            )
            uri = f"file://{out}"
            losses.append(res["metrics"]["value_loss"])
            self.assertIn("value_clipfrac", res["metrics"])
            self.assertEqual(
                read_metadata(f"{out}/critic/weights.safetensors")["format"],
                "rlq-critic-v1",
            )
            self.assertEqual(
                read_metadata(f"{out}/critic/optimizer.safetensors")["iteration"],
                str(step + 1),
            )
        self.assertLess(losses[-1], 0.7 * losses[0], losses)
        self.assertLess(np.mean(losses[-3:]), np.mean(losses[:3]), losses)
        self.assertAlmostEqual(TorchTrainer("cpu").weight_version or 0, 0)

    def test_critic_only_steps_leave_the_policy_alone(self):
        from rlq_torch.safetensors_io import read_safetensors
        from rlq_torch.trainer import TorchTrainer

        tr = TorchTrainer("cpu")
        b = make_batch("r", 0, seed=4)
        r0 = self.step(tr, req(0, f"{self.dir}/c0", num_critic_only_steps=1), b)
        self.assertEqual(r0["metrics"]["critic_only"], 1.0)
        b.step = 1
        r1 = self.step(
            tr,
            req(
                1,
                f"{self.dir}/c1",
                uri=f"file://{self.dir}/c0",
                num_critic_only_steps=1,
            ),
            b,
        )
        self.assertEqual(r1["metrics"]["critic_only"], 0.0)
        from rlq_torch import gpt

        init = gpt.init_weights(gpt.parse_model_config(TINY_MODEL), 7)
        w0 = read_safetensors(f"{self.dir}/c0/weights.safetensors")[1]
        w1 = read_safetensors(f"{self.dir}/c1/weights.safetensors")[1]
        self.assertTrue(
            all(bool((w0[n] == init[n]).all()) for n in init)
        )  # step 0: critic only
        self.assertFalse(
            all(bool((w1[n] == init[n]).all()) for n in init)
        )  # step 1: the actor trains
        c0 = read_safetensors(f"{self.dir}/c0/critic/weights.safetensors")[1]
        self.assertTrue(bool((c0["value_head.weight"] != 0).any()))

    def test_resumed_ppo_step_is_bit_identical_critic_included(self):
        from rlq_torch.trainer import TorchTrainer

        b0, b1 = make_batch("r", 0, seed=1), make_batch("r", 1, seed=2)
        t1 = TorchTrainer("cpu")
        self.step(t1, req(0, f"{self.dir}/p0"), b0)
        self.step(t1, req(1, f"{self.dir}/held", uri=f"file://{self.dir}/p0"), b1)
        self.step(
            TorchTrainer("cpu"),
            req(1, f"{self.dir}/disk", uri=f"file://{self.dir}/p0"),
            b1,
        )
        for f in (
            "weights.safetensors",
            "optimizer.safetensors",
            "critic/weights.safetensors",
            "critic/optimizer.safetensors",
        ):
            self.assertEqual(
                read(f"{self.dir}/held/{f}"), read(f"{self.dir}/disk/{f}"), f
            )

    def test_advantages_are_gae_over_the_critic_values(self):
        """GAE with rlq/algorithms' semantics: a zero-initialised head gives values 0, so with gamma = lambd = 1 and no KL
        every token's advantage is the sample's reward, and the returns too."""
        from rlq_torch import algorithms as A

        o = A.parse_options({"advantage_estimator": "ppo", "gamma": 1.0, "lambd": 1.0})
        mask = A.Ragged(np.ones(5), np.array([0, 2, 5]))
        adv, ret, _ = A.compute_advantages_and_returns(
            [1.0, -0.5], mask, o, values=mask.like(np.zeros(5))
        )
        np.testing.assert_allclose(adv, [1, 1, -0.5, -0.5, -0.5])
        np.testing.assert_allclose(ret, adv)
        o = A.parse_options({"advantage_estimator": "ppo", "gamma": 0.9, "lambd": 0.5})
        v = np.array([0.2, 0.4, 0.1, 0.3, 0.6])
        adv, ret, _ = A.compute_advantages_and_returns(
            [1.0, -0.5], mask, o, values=mask.like(v)
        )
        # by hand, sample 0: delta1 = 1 - 0.4, delta0 = 0 + 0.9*0.4 - 0.2; A1 = delta1, A0 = delta0 + 0.45*A1
        self.assertAlmostEqual(adv[1], 0.6)
        self.assertAlmostEqual(adv[0], 0.16 + 0.45 * 0.6)
        np.testing.assert_allclose(ret, adv + v)


if __name__ == "__main__":
    unittest.main()
