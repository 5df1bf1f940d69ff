"""The train step in-process: determinism, exact resume from files, micro-batching, every loss, gradients."""

import tempfile
import unittest

import numpy as np
from helpers import TINY_MODEL, make_batch, require

require("torch")


def req(run_id, step, out, uri=None, v_in=None, **config):
    c = {"lr": 1e-3, "model": TINY_MODEL, "seed": 7, **config}
    return {
        "run_id": run_id,
        "step": step,
        "attempt": "0",
        "weight_version_in": step if v_in is None else v_in,
        "checkpoint_uri_in": uri,
        "output_dir": out,
        "batch_url": "http://unused",
        "config": c,
    }


def read(path):
    with open(path, "rb") as f:
        return f.read()


class TrainStepTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def run_step(self, trainer, r, batch, progress=None):
        from rlq_torch.trainer import parse_algorithm, parse_train_config

        t = parse_train_config(r["config"], trainer.defaults)
        o = parse_algorithm(r["config"])
        return trainer.train_step(
            r, batch, t, o, progress or (lambda *a: None), lambda: None
        )

    def trainer(self):
        from rlq_torch.trainer import TorchTrainer

        return TorchTrainer("cpu")

    def test_same_request_writes_bit_identical_files(self):
        b = make_batch("r", 0, seed=1)
        a = self.run_step(self.trainer(), req("r", 0, f"{self.dir}/a"), b)
        c = self.run_step(self.trainer(), req("r", 0, f"{self.dir}/c"), b)
        for f in ("weights.safetensors", "optimizer.safetensors"):
            self.assertEqual(read(f"{self.dir}/a/{f}"), read(f"{self.dir}/c/{f}"), f)
        self.assertEqual(a["weight_version_out"], 1)
        self.assertEqual(a["metrics"]["pg_loss"], c["metrics"]["pg_loss"])

    def test_logits_in_row_blocks_give_the_same_numbers_and_files(self):
        """logp_entropy splits [tokens, vocab] logits into row blocks (checkpointed under autograd) to bound the
        float32 copies of a large vocabulary: the same log-probs, entropies and gradients bit for bit, so the same files."""
        import torch
        from rlq_torch import trainer as T

        g = torch.Generator().manual_seed(3)
        logits = torch.randn(37, 11, generator=g, requires_grad=True)
        tgt = torch.randint(0, 11, (37,), generator=g)
        w1, w2 = torch.randn(37, generator=g), torch.randn(37, generator=g)
        results = []
        for elements in (
            1 << 26,
            11 * 5,
        ):  # one block; blocks of 5 rows (the last one 2)
            T.LOGITS_CHUNK_ELEMENTS = elements
            logits.grad = None
            lp, ent = T.logp_entropy(logits, tgt, 0.7, grad=True)
            ((lp * w1).sum() + (ent * w2).sum()).backward()
            results.append(
                (lp.detach().clone(), ent.detach().clone(), logits.grad.clone())
            )
        T.LOGITS_CHUNK_ELEMENTS = 1 << 26
        for one, blocks, what in zip(
            results[0], results[1], ("logp", "entropy", "gradient")
        ):
            self.assertTrue(torch.equal(one, blocks), what)

    def test_hidden_row_blocks_match_one_block_and_never_hold_all_logits(self):
        """logp_entropy_from_hidden runs the lm_head per row block (checkpointed under autograd): the same log-probs
        and entropies as the logits path, gradients equal up to the order the blocks' lm_head gradients are summed in,
        and the step's files equal to float32 rounding."""
        import torch
        from rlq_torch import trainer as T
        from rlq_torch.safetensors_io import read_safetensors

        g = torch.Generator().manual_seed(5)
        head = torch.nn.Linear(6, 11, bias=False)
        hidden = torch.randn(37, 6, generator=g, requires_grad=True)
        tgt = torch.randint(0, 11, (37,), generator=g)
        w1, w2 = torch.randn(37, generator=g), torch.randn(37, generator=g)
        ref_lp, ref_ent = T.logp_entropy(head(hidden), tgt, 0.7, grad=True)
        ((ref_lp * w1).sum() + (ref_ent * w2).sum()).backward()
        ref_grads = (hidden.grad.clone(), head.weight.grad.clone())
        try:
            T.LOGITS_CHUNK_ELEMENTS = 11 * 5  # blocks of 5 rows (the last one 2)
            hidden.grad = head.weight.grad = None
            seen = []
            hook = lambda _m, _i, out: seen.append(out.shape[0])
            h = head.register_forward_hook(hook)
            lp, ent = T.logp_entropy_from_hidden(head, hidden, tgt, 0.7, True, 11)
            ((lp * w1).sum() + (ent * w2).sum()).backward()
            h.remove()
        finally:
            T.LOGITS_CHUNK_ELEMENTS = 1 << 26
        self.assertLessEqual(
            max(seen), 5, "the lm_head ran on more rows than one block"
        )
        torch.testing.assert_close(lp, ref_lp, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(ent, ref_ent, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(hidden.grad, ref_grads[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(head.weight.grad, ref_grads[1], rtol=1e-5, atol=1e-6)
        b = make_batch("r", 0, seed=1)
        self.run_step(self.trainer(), req("r", 0, f"{self.dir}/one"), b)
        try:
            T.LOGITS_CHUNK_ELEMENTS = (
                258 * 3
            )  # TINY_MODEL's vocabulary, three rows a block
            self.run_step(self.trainer(), req("r", 0, f"{self.dir}/rows"), b)
        finally:
            T.LOGITS_CHUNK_ELEMENTS = 1 << 26
        for f in ("weights.safetensors", "optimizer.safetensors"):
            _, one = read_safetensors(f"{self.dir}/one/{f}")
            _, rows = read_safetensors(f"{self.dir}/rows/{f}")
            for n in one:
                # Adam's first step divides by √v: where a gradient is near zero, the summation order's rounding
                # moves the update by up to ~1% of lr (1e-3 here), as in the micro-batch test below.
                torch.testing.assert_close(
                    rows[n], one[n], rtol=1e-5, atol=1e-5, msg=f"{f} {n}"
                )

    def test_resuming_from_files_reproduces_the_held_weights(self):
        b0, b1 = make_batch("r", 0, seed=1), make_batch("r", 1, seed=2)
        t1 = self.trainer()
        self.run_step(t1, req("r", 0, f"{self.dir}/s0"), b0)
        self.run_step(
            t1, req("r", 1, f"{self.dir}/s1-held", uri=f"file://{self.dir}/s0"), b1
        )  # from memory
        t2 = self.trainer()
        self.run_step(
            t2, req("r", 1, f"{self.dir}/s1-disk", uri=f"file://{self.dir}/s0"), b1
        )  # reloads weights + Adam state
        for f in ("weights.safetensors", "optimizer.safetensors"):
            self.assertEqual(
                read(f"{self.dir}/s1-held/{f}"), read(f"{self.dir}/s1-disk/{f}"), f
            )
        from rlq_torch.safetensors_io import read_metadata

        self.assertEqual(
            read_metadata(f"{self.dir}/s1-disk/optimizer.safetensors")["iteration"], "2"
        )
        self.assertEqual(
            read_metadata(f"{self.dir}/s1-disk/weights.safetensors")["version"], "2"
        )

    def test_version_mismatch_is_refused(self):
        from rlq_torch.trainer import StepError

        t = self.trainer()
        self.run_step(t, req("r", 0, f"{self.dir}/s0"), make_batch("r", 0))
        with self.assertRaises(StepError) as e:
            self.run_step(
                self.trainer(),
                req("r", 1, f"{self.dir}/s1", uri=f"file://{self.dir}/s0", v_in=4),
                make_batch("r", 1),
            )
        self.assertEqual(e.exception.code, "bad_request")

    def test_micro_batches_change_rounding_only_and_report_progress(self):
        # Adam divides by sqrt(v): a near-zero gradient amplifies summation-order rounding, hence 1e-5 (lr 1e-3) on weights.
        import torch
        from rlq_torch.safetensors_io import read_safetensors

        b = make_batch("r", 0, groups=4, per_group=4, seed=3)
        seen = []
        one = self.run_step(self.trainer(), req("r", 0, f"{self.dir}/one"), b)
        many = self.run_step(
            self.trainer(),
            req("r", 0, f"{self.dir}/many", max_tokens_per_gpu=40),
            b,
            lambda d, t, p: seen.append((d, t, p)),
        )
        self.assertGreaterEqual(sum(1 for _, _, p in seen if p.startswith("train")), 4)
        for k in ("pg_loss", "entropy_loss", "grad_norm"):
            self.assertAlmostEqual(
                one["metrics"][k],
                many["metrics"][k],
                delta=1e-5 * max(1, abs(one["metrics"][k])),
            )
        _, w1 = read_safetensors(f"{self.dir}/one/weights.safetensors")
        _, w2 = read_safetensors(f"{self.dir}/many/weights.safetensors")
        for n in w1:
            self.assertTrue(torch.allclose(w1[n], w2[n], atol=1e-5), n)

    def test_optimizer_steps_per_rollout(self):
        from rlq_torch.safetensors_io import read_metadata

        r = self.run_step(
            self.trainer(),
            req("r", 0, f"{self.dir}/s", num_steps_per_rollout=4, lr_warmup_iters=2),
            make_batch("r", 0),
        )
        self.assertEqual(r["metrics"]["num_optimizer_steps"], 4)
        self.assertEqual(
            read_metadata(f"{self.dir}/s/optimizer.safetensors")["iteration"], "4"
        )
        self.assertNotEqual(
            r["metrics"]["ppo_kl"], 0
        )  # later minibatches see moved weights

    def test_every_loss_trains(self):
        variants = {
            "gspo": {
                "advantage_estimator": "gspo",
                "eps_clip": 3e-4,
                "eps_clip_high": 4e-4,
            },
            "cispo": {
                "advantage_estimator": "cispo",
                "eps_clip": 1,
                "eps_clip_high": 4,
            },
            "dual clip": {
                "eps_clip_high": 0.28,
                "eps_clip_c": 3,
                "num_steps_per_rollout": 2,
            },
            "rpp": {
                "advantage_estimator": "reinforce_plus_plus",
                "normalize_advantages": True,
                "kl_coef": 0.01,
            },
            "rpp baseline": {
                "advantage_estimator": "reinforce_plus_plus_baseline",
                "normalize_advantages": True,
            },
            "kl loss": {
                "use_kl_loss": True,
                "kl_loss_coef": 0.1,
                "kl_loss_type": "low_var_kl",
                "use_unbiased_kl": True,
            },
            "entropy per token": {
                "entropy_coef": 0.01,
                "calculate_per_token_loss": True,
            },
            "tis": {"use_tis": True, "tis_clip": 1.5},
            "icepop": {"use_tis": True, "tis_function": "icepop"},
            "mis": {
                "use_tis": True,
                "tis_function": "mis",
                "tis_level": "sequence",
                "tis_mode": "clip",
                "use_rs": False,
            },
            "opsm": {"use_opsm": True},
            "bypass": {"use_rollout_logprobs": True},
            "cosine": {
                "lr_decay_style": "cosine",
                "num_rollout": 10,
                "lr_warmup_iters": 1,
            },
        }
        for name, cfg in variants.items():
            with self.subTest(name):
                r = self.run_step(
                    self.trainer(),
                    req("r", 0, f"{self.dir}/{name}", **cfg),
                    make_batch("r", 0, seed=5),
                )
                self.assertTrue(all(np.isfinite(v) for v in r["metrics"].values()))
                self.assertIn("pg_loss", r["metrics"])
                if name == "kl loss":
                    self.assertAlmostEqual(
                        r["metrics"]["kl_loss"], 0.0, delta=1e-9
                    )  # the reference is the seed initialisation
                if name.startswith("tis") or name == "icepop":
                    self.assertIn("tis", r["metrics"])
                if name == "mis":
                    self.assertIn("mis_is_ratio_mean_final", r["metrics"])

    def test_surrogate_gradient_is_the_loss_gradient(self):
        """Backpropagating sum(dL/dlogp · logp) + sum(dL/dH · H) gives dL/dθ (checked by finite differences in float64)."""
        import torch
        from rlq_torch import algorithms as A
        from rlq_torch import gpt
        from rlq_torch.models import EmbeddedPolicy
        from rlq_torch.trainer import TorchTrainer

        trainer = TorchTrainer("cpu")
        policy = EmbeddedPolicy(
            TINY_MODEL,
            gpt.init_weights(gpt.parse_model_config(TINY_MODEL), 3),
            torch.device("cpu"),
        )
        policy.module.to(torch.float64)
        samples = make_batch("r", 0, groups=2, per_group=3, seed=9).samples
        lengths = [s.response_length for s in samples]
        shape = A.Ragged(
            np.zeros(sum(lengths)), np.concatenate([[0], np.cumsum(lengths)])
        )
        rng = np.random.default_rng(0)
        mask = np.concatenate([s.loss_mask for s in samples]).astype(np.float64)
        adv = rng.normal(size=shape.flat.size)
        o = A.parse_options(
            {
                "eps_clip": 0.1,
                "eps_clip_c": 3,
                "use_kl_loss": True,
                "kl_loss_coef": 0.3,
                "kl_loss_type": "k3",
                "entropy_coef": 0.05,
            }
        )
        with torch.no_grad():
            lp0, _ = trainer.token_stats(policy, samples, 0.9, grad=False)
        old = lp0.numpy() + rng.normal(scale=0.3, size=lp0.shape)
        ref = lp0.numpy() + rng.normal(scale=0.3, size=lp0.shape)

        def loss_and_terms(grad):
            lp, en = trainer.token_stats(policy, samples, 0.9, grad=grad)
            terms = A.policy_loss_terms(
                shape.like(lp.detach().numpy()),
                adv,
                mask,
                o,
                old=old,
                ref=ref,
                entropy=en.detach().numpy(),
            )
            return lp, en, terms

        lp, en, terms = loss_and_terms(True)
        (lp * torch.from_numpy(terms.dloss_dlogp)).sum().add(
            (en * torch.from_numpy(terms.dloss_dentropy)).sum()
        ).backward()
        params = policy.named_params()
        direction = {
            n: torch.from_numpy(rng.normal(size=tuple(p.shape))) for n, p in params
        }
        analytic = sum(float((p.grad * direction[n]).sum()) for n, p in params)
        eps = 1e-6
        values = []
        for sign in (1, -1):
            with torch.no_grad():
                for n, p in params:
                    p.add_(sign * eps * direction[n])
            values.append(loss_and_terms(False)[2].loss)
            with torch.no_grad():
                for n, p in params:
                    p.sub_(sign * eps * direction[n])
        numeric = (values[0] - values[1]) / (2 * eps)
        self.assertAlmostEqual(analytic, numeric, delta=1e-5 * max(1.0, abs(numeric)))


if __name__ == "__main__":
    unittest.main()


class OffloadBetweenStepsTest(unittest.TestCase):
    """Colocated mode (rlq_torch/offload.py): the trainer moves what it holds off its device after each
    step and back before the next. On CPU the moves change no number: the order of the calls is the test."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def two_steps(self, tag, **config):
        from rlq_torch.trainer import TorchTrainer, parse_algorithm, parse_train_config

        trainer = TorchTrainer("cpu")
        seen = []  # the move log as each step starts and ends
        self.metrics = []  # each step's metrics
        for step, uri in ((0, None), (1, f"file://{self.dir}/{tag}0")):
            r = req("r", step, f"{self.dir}/{tag}{step}", uri=uri, **config)
            t = parse_train_config(r["config"], trainer.defaults)
            o = parse_algorithm(r["config"])
            progress = lambda *a: seen.append(tuple(trainer.memory.log))  # noqa: E731
            out = trainer.train_step(
                r, make_batch("r", step, seed=step + 1), t, o, progress, lambda: None
            )
            self.metrics.append(out["metrics"])
            seen.append(tuple(trainer.memory.log))
        return trainer, seen

    def test_offloads_after_each_step_and_onloads_before_the_next(self):
        trainer, seen = self.two_steps("on", colocate=True)
        self.assertEqual(
            trainer.memory.log, ["offload:cpu", "onload:cpu", "offload:cpu"]
        )
        # Each step ends offloaded; the second step trains (reports progress) only after its onload.
        self.assertEqual(seen[-1], ("offload:cpu", "onload:cpu", "offload:cpu"))
        second = [s for s in seen if len(s) >= 2]
        self.assertTrue(second and all(s[1] == "onload:cpu" for s in second))
        self.assertTrue(trainer.memory.is_offloaded)
        # The steps report the moves: the policy and its Adam moments (fp32: 3 x 4 bytes a parameter)
        # go off after each step; the second step's onload brings back what the first moved off; the
        # first found nothing held.
        n_params = sum(
            p.numel() for _, p in trainer.held.policy.named_params()
        )  # the embedded model: no buffers
        first, second = self.metrics
        self.assertEqual(first["offload_bytes"], 12 * n_params)
        self.assertEqual(first["onload_bytes"], 0)
        self.assertEqual(second["onload_bytes"], first["offload_bytes"])
        self.assertEqual(second["offload_bytes"], first["offload_bytes"])
        self.assertGreaterEqual(second["onload_s"], 0)
        # offload_train follows colocate; an explicit false keeps everything in place.
        off, _ = self.two_steps("off", colocate=True, offload_train=False)
        self.assertEqual(off.memory.log, [])
        self.assertNotIn("offload_bytes", self.metrics[0])
        split, _ = self.two_steps("split")
        self.assertEqual(split.memory.log, [])
        # The moves change nothing trained: the second step's files are the same bytes.
        for f in ("weights.safetensors", "optimizer.safetensors"):
            self.assertEqual(
                read(f"{self.dir}/on1/{f}"), read(f"{self.dir}/split1/{f}"), f
            )

    def test_weights_the_step_does_not_start_from_stay_on_the_host(self):
        """A step that starts from another checkpoint than the held one (step 1 again, from step 0's
        files, as after a lost commit) drops the held weights without moving them to the device."""
        from rlq_torch.trainer import parse_algorithm, parse_train_config

        trainer, _ = self.two_steps("again", colocate=True)
        r = req(
            "r",
            1,
            f"{self.dir}/again1b",
            uri=f"file://{self.dir}/again0",
            colocate=True,
        )
        t = parse_train_config(r["config"], trainer.defaults)
        o = parse_algorithm(r["config"])
        out = trainer.train_step(
            r, make_batch("r", 1, seed=2), t, o, lambda *a: None, lambda: None
        )
        self.assertEqual(
            trainer.memory.log,
            ["offload:cpu", "onload:cpu", "offload:cpu", "offload:cpu"],
        )
        self.assertEqual(out["metrics"]["onload_bytes"], 0)
        self.assertEqual(
            out["metrics"]["offload_bytes"], self.metrics[0]["offload_bytes"]
        )
        # The same step as the first time: dropping the held weights changed nothing trained.
        self.assertEqual(
            read(f"{self.dir}/again1b/weights.safetensors"),
            read(f"{self.dir}/again1/weights.safetensors"),
        )

    def test_the_reference_policy_goes_off_with_the_held_weights_and_back_on_use(self):
        """With a KL term the cached reference policy (fp32 weights, 4 bytes a parameter, no moments)
        is offloaded after each step too, and the next step brings it back when it computes the
        reference log-probs; the files are those of the run without offload."""
        trainer, _ = self.two_steps(
            "kl", colocate=True, use_kl_loss=True, kl_loss_coef=0.1
        )
        n_params = sum(p.numel() for _, p in trainer.held.policy.named_params())
        first, second = self.metrics
        self.assertEqual(first["offload_bytes"], (12 + 4) * n_params)
        self.assertEqual(second["onload_bytes"], first["offload_bytes"])
        self.assertEqual(
            trainer.memory.log,
            ["offload:cpu", "onload:cpu", "onload_reference:cpu", "offload:cpu"],
        )
        self.two_steps("klsplit", use_kl_loss=True, kl_loss_coef=0.1)
        for f in ("weights.safetensors", "optimizer.safetensors"):
            self.assertEqual(
                read(f"{self.dir}/kl1/{f}"), read(f"{self.dir}/klsplit1/{f}"), f
            )
