"""Sequence packing (use_dynamic_batch_size): packed rows give the padded computation's loss and gradients."""

import os
import tempfile
import unittest

import numpy as np
from helpers import TINY_MODEL, make_batch, require, step_in_process

require("torch")


class PackingTest(unittest.TestCase):
    def policy64(self):
        import torch
        from rlq_torch import gpt
        from rlq_torch.models import EmbeddedPolicy

        p = EmbeddedPolicy(
            TINY_MODEL,
            gpt.init_weights(gpt.parse_model_config(TINY_MODEL), 11),
            torch.device("cpu"),
        )
        p.module.to(torch.float64)
        for _, q in p.named_params():
            q.requires_grad_(True)
        return p

    def loss_and_grads(self, packed, max_tokens):
        """The full train-step loss (rlq/algorithms' denominators: each sample's mask sum, N) over micro-batches."""
        import torch
        from rlq_torch import algorithms as A
        from rlq_torch.trainer import TorchTrainer, micro_batches, packed_micro_batches

        trainer = TorchTrainer("cpu")
        policy = self.policy64()
        samples = make_batch("r", 0, groups=4, per_group=4, seed=21).samples
        lengths = [s.response_length for s in samples]
        shape = A.Ragged(
            np.zeros(sum(lengths)), np.concatenate([[0], np.cumsum(lengths)])
        )
        rng = np.random.default_rng(5)
        mask = np.concatenate([s.loss_mask for s in samples]).astype(np.float64)
        adv = rng.normal(size=shape.flat.size)
        old = -rng.uniform(0.5, 6, size=shape.flat.size)
        o = A.parse_options(
            {
                "eps_clip": 0.2,
                "entropy_coef": 0.01,
                "use_kl_loss": True,
                "kl_loss_coef": 0.1,
                "kl_loss_type": "low_var_kl",
            }
        )
        own = shape.seg_sum(mask)
        mbs = (
            packed_micro_batches(samples, max_tokens)
            if packed
            else micro_batches(samples, max_tokens)
        )
        loss = 0.0
        for lo, hi in mbs:
            lp, en = trainer.token_stats(
                policy, samples[lo:hi], 0.8, grad=True, packed=packed
            )
            a, b = int(shape.offsets[lo]), int(shape.offsets[hi])
            terms = A.policy_loss_terms(
                shape.slice(lo, hi).like(lp.detach().numpy()),
                adv[a:b],
                mask[a:b],
                o,
                old=old[a:b],
                ref=old[a:b] + 0.1,
                entropy=en.detach().numpy(),
                sample_denominators=own[lo:hi],
                normalizer=float(len(samples)),
            )
            (lp * torch.from_numpy(terms.dloss_dlogp)).sum().add(
                (en * torch.from_numpy(terms.dloss_dentropy)).sum()
            ).backward()
            loss += terms.loss
        return loss, {n: p.grad.clone() for n, p in policy.named_params()}, mbs

    def test_packed_and_padded_give_the_same_loss_and_gradients_float64(self):
        import torch

        for budget in (60, 200):
            with self.subTest(max_tokens_per_gpu=budget):
                l0, g0, mbs0 = self.loss_and_grads(False, budget)
                l1, g1, mbs1 = self.loss_and_grads(True, budget)
                self.assertLessEqual(
                    len(mbs1), len(mbs0)
                )  # no padding: as many or fewer micro-batches
                self.assertAlmostEqual(l0, l1, delta=1e-6 * max(1.0, abs(l0)))
                self.assertNotEqual(l0, 0.0)
                for n in g0:
                    self.assertTrue(
                        torch.allclose(g0[n], g1[n], atol=1e-6, rtol=0),
                        f"{n}: {float((g0[n] - g1[n]).abs().max())}",
                    )
                    self.assertTrue(g0[n].abs().max() > 0 or n.startswith("tok_emb"), n)

    def test_a_packed_row_is_each_sequence_alone(self):
        import torch
        from rlq_torch.trainer import TorchTrainer

        trainer = TorchTrainer("cpu")
        policy = self.policy64()
        samples = make_batch("r", 0, groups=2, per_group=3, seed=4).samples
        with torch.no_grad():
            alone = torch.cat(
                [trainer.token_stats(policy, [s], 1.0, grad=False)[0] for s in samples]
            )
            packed = trainer.token_stats(policy, samples, 1.0, grad=False, packed=True)[
                0
            ]
        self.assertTrue(
            torch.allclose(alone, packed, atol=1e-12, rtol=0),
            float((alone - packed).abs().max()),
        )

    def test_dynamic_micro_batches_respect_the_token_budget(self):
        from rlq_torch.trainer import packed_micro_batches

        samples = make_batch("r", 0, groups=6, per_group=4, seed=2).samples
        for budget in (1, 17, 40, 100, 10_000):
            mbs = packed_micro_batches(samples, budget)
            self.assertEqual(
                [lo for lo, _ in mbs] + [len(samples)], [0] + [hi for _, hi in mbs]
            )  # consecutive, covering
            for lo, hi in mbs:
                total = sum(len(s.tokens) - 1 for s in samples[lo:hi])
                self.assertTrue(
                    total <= budget or hi - lo == 1, (budget, lo, hi, total)
                )

    def test_a_train_step_with_packing_on_and_off(self):
        import torch
        from rlq_torch.safetensors_io import read_safetensors
        from rlq_torch.trainer import TorchTrainer

        b = make_batch("r", 0, groups=4, per_group=4, seed=8)
        results = {}
        with tempfile.TemporaryDirectory() as tmp:
            for packed in (False, True):
                c = {
                    "lr": 1e-3,
                    "model": TINY_MODEL,
                    "seed": 7,
                    "max_tokens_per_gpu": 48,
                    "use_dynamic_batch_size": packed,
                    "entropy_coef": 0.01,
                }
                phases = []
                res = step_in_process(
                    TorchTrainer("cpu"),
                    b,
                    c,
                    os.path.join(tmp, str(packed)),
                    progress=lambda d, t, p, phases=phases: phases.append(p),
                )
                results[packed] = (
                    res,
                    read_safetensors(
                        os.path.join(tmp, str(packed), "weights.safetensors")
                    )[1],
                    phases,
                )
        (r0, w0, p0), (r1, w1, p1) = results[False], results[True]
        for k in ("pg_loss", "entropy_loss", "loss"):
            self.assertAlmostEqual(
                r0["metrics"][k],
                r1["metrics"][k],
                delta=1e-6 * max(1.0, abs(r0["metrics"][k])),
                msg=k,
            )
        for n in w0:
            self.assertTrue(torch.allclose(w0[n], w1[n], atol=1e-5, rtol=0), n)
        self.assertLess(
            sum(p.startswith("train") for p in p1),
            sum(p.startswith("train") for p in p0),
        )  # fewer, fuller micro-batches

    def test_gradient_checkpointing_changes_memory_not_the_step(self):
        """Recomputing each block in the backward gives the same gradients, so the same files byte for byte (CPU)."""
        from rlq_torch.trainer import TorchTrainer

        b = make_batch("r", 0, groups=2, per_group=4, seed=6)
        files = {}
        with tempfile.TemporaryDirectory() as tmp:
            for ckpt in (False, True):
                c = {
                    "lr": 1e-3,
                    "model": TINY_MODEL,
                    "seed": 7,
                    "gradient_checkpointing": ckpt,
                    "max_tokens_per_gpu": 64,
                    "use_dynamic_batch_size": True,
                }
                out = os.path.join(tmp, str(ckpt))
                step_in_process(TorchTrainer("cpu"), b, c, out)
                with open(os.path.join(out, "weights.safetensors"), "rb") as f:
                    files[ckpt] = f.read()
        self.assertEqual(files[False], files[True])

    def test_packing_needs_a_token_budget(self):
        from rlq_torch.trainer import StepError, parse_train_config

        with self.assertRaises(StepError) as e:
            parse_train_config({"use_dynamic_batch_size": True}, {})
        self.assertIn("max_tokens_per_gpu", str(e.exception))


if __name__ == "__main__":
    unittest.main()
