"""The loss on the device (device_loss.py) against policy_loss_terms on the host, the on-policy old log-probs, and the step-time split."""

import os
import tempfile
import unittest

import numpy as np
from helpers import make_batch, require

require("torch")

import torch
from rlq_torch import algorithms as A
from rlq_torch import device_loss
from rlq_torch.efficiency import SPLIT_KEYS, model_flops
from rlq_torch.safetensors_io import read_safetensors
from rlq_torch.trainer import TorchTrainer, parse_algorithm, parse_train_config
from test_trainer import req

# Option sets the device loss covers: each estimator it runs, the dual clip, every KL type with and without
# the unbiased ratio, entropy, rollout log-probs as the old ones, per-token denominators.
CONFIGS = [
    {},
    {"advantage_estimator": "cispo", "eps_clip_high": 0.28},
    {"eps_clip_c": 3.0, "entropy_coef": 0.01},
    {
        "advantage_estimator": "reinforce_plus_plus_baseline",
        "normalize_advantages": True,
        "calculate_per_token_loss": True,
    },
    {"use_rollout_logprobs": True, "entropy_coef": -0.02},
] + [
    {"use_kl_loss": True, "kl_loss_coef": 0.1, "kl_loss_type": k, "use_unbiased_kl": u}
    for k in ("k1", "k2", "k3", "low_var_kl")
    for u in (False, True)
]


def run_step(trainer, r, batch):
    t = parse_train_config(r["config"], trainer.defaults)
    o = parse_algorithm(r["config"])
    return trainer.train_step(r, batch, t, o, lambda *a: None, lambda: None)


class DeviceLossTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_gradients_and_metrics_match_the_host_loss(self):
        rng = np.random.default_rng(4)
        lengths = [3, 1, 7, 4, 5]
        shape = A.Ragged(
            np.zeros(sum(lengths)), np.concatenate([[0], np.cumsum(lengths)])
        )
        n = sum(lengths)
        lp, old, rollout, ref = (-rng.uniform(0.05, 4, size=n) for _ in range(4))
        old[2] = lp[2] * 3  # far outside the clip range, both sides
        old[5] = lp[5] / 4
        ent = rng.uniform(0, 5, size=n)
        adv = rng.normal(size=n)
        mask = (rng.random(n) > 0.2).astype(np.float64)
        denom = np.maximum(mask, (rng.random(n) > 0.5).astype(np.float64))
        for cfg in CONFIGS:
            o = parse_algorithm(cfg)
            self.assertIsNone(device_loss.unsupported(o), cfg)
            own = shape.seg_sum(denom)
            normalizer = (
                float(sum(max(x, 1.0) for x in own.tolist()))
                if o["calculate_per_token_loss"]
                else float(len(lengths))
            )
            host = A.policy_loss_terms(
                shape.like(lp),
                adv,
                mask,
                o,
                old=old,
                denom_mask=denom,
                ref=ref,
                rollout=rollout,
                entropy=ent,
                sample_denominators=own,
                normalizer=normalizer,
            )
            w = device_loss.aggregation_weights(
                shape, mask, denom, o, [(0, 2), (2, 5)], own, normalizer
            )
            np.testing.assert_array_equal(w, host.weights)
            t = lambda x: torch.from_numpy(np.asarray(x, dtype=np.float64))
            dlp, dent, vec = device_loss.loss_terms(
                t(lp).float(),
                t(ent).float(),
                t(w),
                t(adv),
                t(old),
                t(rollout),
                t(ref),
                o,
            )
            # The device loss reads float32 log-probs (what the model gives): compare with the host on the same values.
            host = A.policy_loss_terms(
                shape.like(lp.astype(np.float32).astype(np.float64)),
                adv,
                mask,
                o,
                old=old,
                denom_mask=denom,
                ref=ref,
                rollout=rollout,
                entropy=ent.astype(np.float32).astype(np.float64),
                sample_denominators=own,
                normalizer=normalizer,
            )
            np.testing.assert_allclose(
                dlp.numpy(), host.dloss_dlogp, rtol=1e-12, atol=1e-15, err_msg=str(cfg)
            )
            np.testing.assert_allclose(
                dent.numpy(),
                host.dloss_dentropy,
                rtol=1e-12,
                atol=1e-15,
                err_msg=str(cfg),
            )
            names = device_loss.metric_names(o)
            self.assertEqual(set(names), set(host.metrics), cfg)
            for name, v in zip(names, vec.tolist()):
                self.assertAlmostEqual(
                    v,
                    host.metrics[name],
                    delta=1e-12 * max(1.0, abs(host.metrics[name])),
                    msg=f"{cfg} {name}",
                )

    def test_a_step_with_the_device_loss_matches_the_host_loss(self):
        """The whole step, device loss against policy_loss_terms (forced by marking every option unsupported): the same files to
        float32 rounding and the same metrics; two micro-batches, and a KL term that needs the reference forward."""
        b = make_batch("r", 0, seed=1)
        cfg = {
            "max_tokens_per_gpu": 60,
            "use_kl_loss": True,
            "kl_loss_coef": 0.05,
            "kl_loss_type": "low_var_kl",
            "entropy_coef": 0.01,
        }
        dev = run_step(TorchTrainer("cpu"), req("r", 0, f"{self.dir}/dev", **cfg), b)
        real = device_loss.unsupported
        device_loss.unsupported = lambda o: "forced by the test"
        try:
            host = run_step(
                TorchTrainer("cpu"), req("r", 0, f"{self.dir}/host", **cfg), b
            )
        finally:
            device_loss.unsupported = real
        for k in (
            "pg_loss",
            "pg_clipfrac",
            "ppo_kl",
            "entropy_loss",
            "kl_loss",
            "loss",
            "grad_norm",
        ):
            self.assertAlmostEqual(
                dev["metrics"][k],
                host["metrics"][k],
                delta=1e-9 * max(1.0, abs(host["metrics"][k])),
                msg=k,
            )
        self.assertEqual(set(dev["metrics"]) - set(host["metrics"]), set())
        for f in ("weights.safetensors", "optimizer.safetensors"):
            _, a = read_safetensors(f"{self.dir}/dev/{f}")
            _, c = read_safetensors(f"{self.dir}/host/{f}")
            for n in a:
                torch.testing.assert_close(
                    a[n], c[n], rtol=1e-6, atol=1e-7, msg=f"{f} {n}"
                )

    def test_on_policy_old_log_probs_come_from_the_training_forward(self):
        """One optimizer step: the training forward's log-probs are the old ones, so no separate forward runs, and the
        files and metrics equal those of a step that recomputes them (bit for bit on the CPU)."""
        b = make_batch("r", 0, seed=2)
        seen = []
        trainer = TorchTrainer("cpu")
        r = req("r", 0, f"{self.dir}/fast", max_tokens_per_gpu=60)
        t, o = parse_train_config(r["config"], {}), parse_algorithm(r["config"])
        fast = trainer.train_step(
            r, b, t, o, lambda d, n, p: seen.append(p), lambda: None
        )
        self.assertFalse(any(p.startswith("old_logprobs") for p in seen), seen)
        self.assertEqual(fast["metrics"]["old_logprobs_s"], 0.0)
        TorchTrainer.ALWAYS_RECOMPUTE_OLD = True
        try:
            slow = run_step(
                TorchTrainer("cpu"),
                req("r", 0, f"{self.dir}/slow", max_tokens_per_gpu=60),
                b,
            )
        finally:
            TorchTrainer.ALWAYS_RECOMPUTE_OLD = False
        self.assertGreater(slow["metrics"]["old_logprobs_s"], 0.0)
        for k in (
            "pg_loss",
            "ppo_kl",
            "entropy_loss",
            "grad_norm",
            "train_rollout_logprob_abs_diff",
        ):
            self.assertEqual(fast["metrics"][k], slow["metrics"][k], k)
        for f in ("weights.safetensors", "optimizer.safetensors"):
            with (
                open(f"{self.dir}/fast/{f}", "rb") as x,
                open(f"{self.dir}/slow/{f}", "rb") as y,
            ):
                self.assertEqual(x.read(), y.read(), f)

    def test_the_step_reports_its_time_split_and_flops(self):
        """The split covers the step's wall time (within 5%), tokens/s and TFLOP/s follow from it; MFU only with a known peak."""
        b = make_batch("r", 0, seed=3)
        os.environ.pop("RLQ_DEVICE_PEAK_TFLOPS", None)
        TorchTrainer.ALWAYS_RECOMPUTE_OLD = True  # every phase runs
        try:
            m = run_step(
                TorchTrainer("cpu"),
                req("r", 0, f"{self.dir}/a", use_kl_loss=True, kl_loss_coef=0.1),
                b,
            )["metrics"]
        finally:
            TorchTrainer.ALWAYS_RECOMPUTE_OLD = False
        split = {k: m[k] for k in SPLIT_KEYS if k != "push_s"}
        self.assertTrue(all(v >= 0 for v in split.values()), split)
        for k in (
            "load_s",
            "old_logprobs_s",
            "ref_logprobs_s",
            "fwd_bwd_s",
            "optimizer_s",
            "save_s",
        ):
            self.assertGreater(split[k], 0.0, k)
        self.assertLessEqual(
            abs(sum(split.values()) - m["step_s"]),
            0.05 * m["step_s"],
            (split, m["step_s"]),
        )
        tokens = sum(len(s.tokens) for s in b.samples)
        self.assertAlmostEqual(
            m["tokens_per_s"], tokens / m["step_s"], delta=1e-6 * m["tokens_per_s"]
        )
        self.assertAlmostEqual(
            m["tflops"],
            m["model_flops_per_step"] / m["step_s"] / 1e12,
            delta=1e-9 * m["tflops"],
        )
        self.assertNotIn("mfu", m)
        os.environ["RLQ_DEVICE_PEAK_TFLOPS"] = "0.5"
        try:
            m2 = run_step(TorchTrainer("cpu"), req("r", 0, f"{self.dir}/b"), b)[
                "metrics"
            ]
        finally:
            del os.environ["RLQ_DEVICE_PEAK_TFLOPS"]
        self.assertAlmostEqual(m2["mfu"], m2["tflops"] / 0.5, delta=1e-9)

    def test_fused_adamw_matches_the_plain_update(self):
        """torch's fused AdamW kernel (used on cuda) against the plain per-parameter update (kept on the CPU): the same
        weights and moments up to float32 rounding, over two steps with weight decay (on matrices only)."""
        from rlq_torch import sharded_adamw

        b0, b1 = make_batch("r", 0, seed=1), make_batch("r", 1, seed=2)
        cfg = {"weight_decay": 0.1}
        out = {}
        for name, devices in (("plain", ()), ("fused", ("cpu",))):
            real = sharded_adamw.FUSED_DEVICES
            sharded_adamw.FUSED_DEVICES = devices
            try:
                tr = TorchTrainer("cpu")
                run_step(tr, req("r", 0, f"{self.dir}/{name}0", **cfg), b0)
                run_step(
                    tr,
                    req(
                        "r",
                        1,
                        f"{self.dir}/{name}1",
                        uri=f"file://{self.dir}/{name}0",
                        **cfg,
                    ),
                    b1,
                )
            finally:
                sharded_adamw.FUSED_DEVICES = real
            out[name] = {
                f: read_safetensors(f"{self.dir}/{name}1/{f}")[1]
                for f in ("weights.safetensors", "optimizer.safetensors")
            }
        for f, tensors in out["plain"].items():
            for n, x in tensors.items():
                # Adam divides by √v: where a gradient is near zero, rounding moves the update by up to ~1e-3·lr (lr 1e-3 here).
                torch.testing.assert_close(
                    out["fused"][f][n], x, rtol=1e-5, atol=1e-6, msg=f"{f} {n}"
                )
        self.assertFalse(
            all(
                torch.equal(out["fused"]["weights.safetensors"][n], x)
                for n, x in out["plain"]["weights.safetensors"].items()
            ),
            "the fused kernel did not run (the weights are bit-identical to the plain loop's)",
        )

    def test_flops_per_token_formula(self):
        """6·N·T + 6·L·d_attn·T² per sequence; prime-rl's published Qwen3-0.6B point (11.9k tokens/s at 16k, 11.1% of 989.4) by it."""
        shape = {"params": 596_049_920, "layers": 28, "d_attn": 16 * 128}
        per_token = model_flops(shape, [16384]) / 16384
        self.assertAlmostEqual(
            per_token, 6 * 596_049_920 + 6 * 28 * 2048 * 16384, delta=1
        )
        self.assertAlmostEqual(per_token * 11.9e3 / 989.4e12, 0.111, delta=0.0015)
        self.assertAlmostEqual(
            model_flops(shape, [5, 7], forward_only=True) * 3,
            model_flops(shape, [5, 7]),
            delta=1e-3,
        )


if __name__ == "__main__":
    unittest.main()
