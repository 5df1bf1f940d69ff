"""The optimizer step of real train steps against references that share no code with the trainer's schedule or clip.

Over 20 optimizer steps (one per train step, weights held between steps) of two schedules, the rate each step
reports and applies equals Megatron's OptimizerParamScheduler (get_lr written out below: step(0) when it is
built, step() after every optimizer step), and the gradient norm and the clipped gradients equal
torch.nn.utils.clip_grad_norm_ on an identical copy of the model, fed the same batch through a loss written
here (the PPO surrogate on-policy, GRPO without reward normalisation: d loss / d logp = -A_i / (D_i · N)).
The weights each step writes equal torch.optim.AdamW's update at the reference rate from the trainer's clipped
gradients, so the reported rate is the one applied."""

import math
import os
import tempfile
import unittest

import numpy as np
from helpers import TINY_MODEL, make_batch, require

require("torch")

STEPS = 20
SCHEDULES = {
    # warmup, cosine decay to min_lr > 0, then min_lr (steps 16..19); weight decay on the >= 2-D tensors
    "cosine": {
        "lr": 1e-2,
        "min_lr": 1e-3,
        "lr_warmup_iters": 3,
        "lr_decay_style": "cosine",
        "lr_decay_iters": 15,
        "clip_grad": 0.6,
        "weight_decay": 0.01,
    },
    # warmup, linear decay to 0 at step 18
    "linear": {
        "lr": 5e-3,
        "min_lr": 0.0,
        "lr_warmup_iters": 2,
        "lr_decay_style": "linear",
        "lr_decay_iters": 18,
        "clip_grad": 0.45,
    },
}


class MegatronScheduler:
    """megatron/core/optimizer_param_scheduler.py, the parts a run config reaches: init_lr 0, decay steps
    counted in optimizer steps (Megatron counts samples, lr_*_iters × global batch, and steps by a global batch:
    the same ratios)."""

    def __init__(
        self,
        max_lr,
        min_lr,
        lr_warmup_steps,
        lr_decay_steps,
        lr_decay_style,
        init_lr=0.0,
    ):
        self.max_lr, self.min_lr, self.init_lr = max_lr, min_lr, init_lr
        self.lr_warmup_steps, self.lr_decay_steps, self.lr_decay_style = (
            lr_warmup_steps,
            lr_decay_steps,
            lr_decay_style,
        )
        self.num_steps = 0
        self.step(0)

    def get_lr(self):
        if self.lr_warmup_steps > 0 and self.num_steps <= self.lr_warmup_steps:
            return self.init_lr + (
                (self.max_lr - self.init_lr)
                * float(self.num_steps)
                / float(self.lr_warmup_steps)
            )
        if self.lr_decay_style == "constant":
            return self.max_lr
        if self.num_steps > self.lr_decay_steps:
            return self.min_lr
        num_steps_ = self.num_steps - self.lr_warmup_steps
        decay_steps_ = self.lr_decay_steps - self.lr_warmup_steps
        decay_ratio = float(num_steps_) / float(decay_steps_)
        assert 0.0 <= decay_ratio <= 1.0
        delta_lr = self.max_lr - self.min_lr
        if self.lr_decay_style == "linear":
            coeff = 1.0 - decay_ratio
        elif self.lr_decay_style == "cosine":
            coeff = 0.5 * (math.cos(math.pi * decay_ratio) + 1.0)
        else:
            raise ValueError(self.lr_decay_style)
        return self.min_lr + coeff * delta_lr

    def step(self, increment=1):
        self.num_steps += increment
        self.lr = self.get_lr()


def batch(step):
    """Two groups of four; rewards of both signs (the advantages, unnormalised)."""
    b = make_batch("sched", step, groups=2, per_group=4, seed=100 + step)
    rng = np.random.default_rng(step)
    for s in b.samples:
        s.reward = 0.3 * float(rng.normal())
    return b


class OptimizerScheduleTest(unittest.TestCase):
    def run_schedule(self, name):
        import torch
        from rlq_torch import gpt
        from rlq_torch.safetensors_io import read_safetensors
        from rlq_torch.trainer import TorchTrainer, parse_algorithm, parse_train_config

        class RecordingTrainer(TorchTrainer):
            """Keeps the gradients the AdamW update reads (after the clip)."""

            def _adam_update(self, params, *args):
                self.clipped = {n: p.grad.detach().clone() for n, p in params}
                return super()._adam_update(params, *args)

        sched_cfg = SCHEDULES[name]
        cfg = {
            "model": TINY_MODEL,
            "seed": 7,
            "advantage_estimator": "grpo",
            "rewards_normalization": False,
            **sched_cfg,
        }
        model_cfg = gpt.parse_model_config(TINY_MODEL)
        copy = gpt.RlqGpt(
            model_cfg, gpt.init_weights(model_cfg, 7)
        )  # the trainer's version 0: `model` from `seed`
        params = copy.canonical
        wd = sched_cfg.get("weight_decay", 0.0)
        adamw = torch.optim.AdamW(
            [
                {"params": [p for _, p in params if p.dim() > 1], "weight_decay": wd},
                {"params": [p for _, p in params if p.dim() <= 1], "weight_decay": 0.0},
            ],
            lr=0.0,
            betas=(0.9, 0.999),
            eps=1e-8,
        )
        megatron = MegatronScheduler(
            sched_cfg["lr"],
            sched_cfg["min_lr"],
            sched_cfg["lr_warmup_iters"],
            sched_cfg["lr_decay_iters"],
            sched_cfg["lr_decay_style"],
        )
        trainer = RecordingTrainer("cpu")
        worst = {"lr": 0.0, "grad_norm": 0.0, "clipped_grad": 0.0, "weights": 0.0}
        clipped_steps = 0
        uri = None
        with tempfile.TemporaryDirectory() as tmp:
            for k in range(STEPS):
                b = batch(k)
                # the reference: the same weights (the trainer's last output), the same batch, sample by sample
                if uri is not None:
                    _, w = read_safetensors(
                        os.path.join(tmp, str(k - 1), "weights.safetensors")
                    )
                    with torch.no_grad():
                        for n, p in params:
                            p.copy_(w[n])
                for _, p in params:
                    p.grad = None
                loss = torch.zeros((), dtype=torch.float64)
                for s in b.samples:
                    ids = torch.from_numpy(s.tokens[None, :-1].astype(np.int64))
                    logits = copy.logits(copy.hidden_states(ids))[0]  # [T-1, vocab]
                    pos = torch.arange(s.prompt_length - 1, len(s.tokens) - 1)
                    logp = torch.log_softmax(logits.float(), -1)[
                        pos,
                        torch.from_numpy(s.tokens[s.prompt_length :].astype(np.int64)),
                    ]
                    mask = torch.from_numpy(s.loss_mask.astype(np.float32))
                    ratio = torch.exp(logp - logp.detach())
                    loss = loss + (-s.reward * ratio * mask).sum() / max(
                        float(mask.sum()), 1.0
                    ) / len(b.samples)
                loss.backward()
                norm = float(
                    torch.nn.utils.clip_grad_norm_(
                        [p for _, p in params], sched_cfg["clip_grad"]
                    )
                )
                ref_clipped = {n: p.grad.detach().clone() for n, p in params}
                ref_lr = megatron.lr

                out = os.path.join(tmp, str(k))
                req = {
                    "run_id": "sched",
                    "step": k,
                    "attempt": "0",
                    "weight_version_in": k,
                    "checkpoint_uri_in": uri,
                    "output_dir": out,
                    "config": cfg,
                }
                res = trainer.train_step(
                    req,
                    b,
                    parse_train_config(cfg, {}),
                    parse_algorithm(cfg),
                    lambda *a: None,
                    lambda: None,
                )
                uri = res["checkpoint_uri"]
                m = res["metrics"]
                self.assertEqual(m["num_optimizer_steps"], 1.0)
                worst["lr"] = max(worst["lr"], abs(m["lr"] - ref_lr))
                worst["grad_norm"] = max(worst["grad_norm"], abs(m["grad_norm"] - norm))
                self.assertLessEqual(
                    abs(m["lr"] - ref_lr),
                    1e-12,
                    f"step {k}: lr {m['lr']} vs Megatron's {ref_lr}",
                )
                self.assertLessEqual(
                    abs(m["grad_norm"] - norm),
                    1e-6,
                    f"step {k}: grad norm {m['grad_norm']} vs torch's {norm}",
                )
                for n, g in ref_clipped.items():
                    d = float((trainer.clipped[n] - g).abs().max())
                    worst["clipped_grad"] = max(worst["clipped_grad"], d)
                    self.assertLessEqual(d, 1e-6, f"step {k}: clipped gradient of {n}")
                clipped_steps += norm > sched_cfg["clip_grad"]

                # the update the trainer applied is AdamW's at the reference rate, from the trainer's clipped gradients
                for n, p in params:
                    p.grad = trainer.clipped[n]
                for group in adamw.param_groups:
                    group["lr"] = ref_lr
                adamw.step()
                megatron.step()
                _, w = read_safetensors(os.path.join(out, "weights.safetensors"))
                for n, p in params:
                    d = float((w[n] - p.detach()).abs().max())
                    worst["weights"] = max(worst["weights"], d)
                    self.assertLessEqual(
                        d, 1e-6, f"step {k}: weights of {n} after the update"
                    )
                if (
                    k == 0
                ):  # warmup starts at rate 0: Megatron's first step leaves the weights as they were
                    self.assertEqual(m["lr"], 0.0)
        self.assertTrue(
            0 < clipped_steps < STEPS,
            f"{clipped_steps} of {STEPS} steps clipped: pick clip_grad so both cases run",
        )
        print(
            f"\n{name}: max |difference| over {STEPS} steps: {worst} ({clipped_steps} steps clipped)"
        )
        return worst

    def test_cosine_warmup_then_decay_to_a_min_lr(self):
        self.run_schedule("cosine")

    def test_linear_warmup_then_decay_to_zero(self):
        self.run_schedule("linear")

    def test_the_schedule_reads_no_step_ahead(self):
        """Warmup 2 then linear to 0 at 6: Megatron's rates 0, 0.5, 1, 0.75, 0.5, 0.25, 0 (× lr) at optimizer steps 0..6."""
        from rlq_torch.train_config import TrainConfig, learning_rate

        t = TrainConfig(
            lr=1.0, lr_warmup_iters=2, lr_decay_style="linear", lr_decay_iters=6
        )
        self.assertEqual(
            [learning_rate(t, 6, i) for i in range(8)],
            [0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0],
        )


if __name__ == "__main__":
    unittest.main()
