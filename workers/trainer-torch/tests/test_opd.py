"""On-policy distillation goldens for the torch trainer, derived by hand from slime's formula
(slime/backends/megatron_utils/loss.py compute_advantages_and_returns, use_opd branch):
A_t - opd_kl_coef * (log pi_student - log pi_teacher). The same numbers as src/algorithms/opd.test.ts.

    .venv/bin/python -m unittest discover -s workers/trainer-torch/tests -p 'test_opd.py'
"""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from helpers import require  # noqa: E402

require("numpy")

import numpy as np  # noqa: E402
from rlq_torch import algorithms as A  # noqa: E402
from rlq_torch.batch import Batch, Sample, decode_batch, encode_batch  # noqa: E402
from rlq_torch.opd import opd_teacher_log_probs  # noqa: E402
from rlq_torch.ragged import Ragged  # noqa: E402
from rlq_torch.train_config import StepError, parse_algorithm  # noqa: E402

# student - teacher = [[0.2, -0.6, 0.0], [1.0, -1.0]]
STUDENT = [[-0.5, -1.0, -2.0], [-0.1, -3.0]]
TEACHER = [[-0.7, -0.4, -2.0], [-1.1, -2.0]]
MASK = Ragged.from_lists([[1, 1, 1], [1, 1]])


def opts(**kw):
    return A.parse_options({"use_opd": True, "opd_kl_coef": 0.5, **kw})


def adv(rewards, o, **kw):
    a, r, _ = A.compute_advantages_and_returns(
        rewards,
        MASK,
        o,
        old_log_probs=Ragged.from_lists(STUDENT),
        teacher_log_probs=Ragged.from_lists(TEACHER),
        **kw,
    )
    return a, r


class OpdAdvantageGoldens(unittest.TestCase):
    def test_grpo(self):
        # 0.7 - 0.5*[0.2, -0.6, 0] ; -0.7 - 0.5*[1, -1]
        a, _ = adv([0.7, -0.7], opts())
        np.testing.assert_allclose(a, [0.6, 1.0, 0.7, -1.2, -0.2], atol=1e-12)

    def test_zero_reward_is_pure_distillation(self):
        a, _ = adv([0.0, 0.0], opts(opd_kl_coef=1.0))
        np.testing.assert_allclose(a, [-0.2, 0.6, 0.0, -1.0, 1.0], atol=1e-12)

    def test_ppo_gae_then_opd_returns_untouched(self):
        # gamma = lambda = 1: A_t = sum_{k>=t} r_k - V_t -> [0.9, 0.8, 0.7], [-0.5, -0.4]; returns [1,1,1], [0,0]
        values = Ragged.from_lists([[0.1, 0.2, 0.3], [0.5, 0.4]])
        a, r = adv([1.0, 0.0], opts(advantage_estimator="ppo"), values=values)
        np.testing.assert_allclose(a, [0.8, 1.1, 0.7, -1.0, 0.1], atol=1e-12)
        np.testing.assert_allclose(r, [1, 1, 1, 0, 0], atol=1e-12)

    def test_refuses_without_teacher(self):
        with self.assertRaisesRegex(
            A.AlgorithmError, "use_opd needs oldLogProbs and teacherLogProbs"
        ):
            A.compute_advantages_and_returns(
                [1.0, 0.0], MASK, opts(), old_log_probs=Ragged.from_lists(STUDENT)
            )


class OpdLossGoldens(unittest.TestCase):
    """At the start weights (logp = old, ratio 1), with the GRPO advantages above."""

    ADV = np.array([0.6, 1.0, 0.7, -1.2, -0.2])

    def terms(self, est):
        lp = Ragged.from_lists(STUDENT)
        return A.policy_loss_terms(
            lp,
            self.ADV,
            MASK.flat,
            A.parse_options({"advantage_estimator": est}),
            old=lp.flat.copy(),
        )

    def test_grpo_loss_and_gradient(self):
        t = self.terms("grpo")
        self.assertAlmostEqual(t.loss, -1 / 30, places=12)
        np.testing.assert_allclose(
            t.dloss_dlogp, [-0.6 / 6, -1.0 / 6, -0.7 / 6, 1.2 / 4, 0.2 / 4], atol=1e-12
        )

    def test_gspo_sequence_ratio_spreads_the_gradient(self):
        t = self.terms("gspo")
        self.assertAlmostEqual(t.loss, -1 / 30, places=12)
        np.testing.assert_allclose(
            t.dloss_dlogp, [-2.3 / 18] * 3 + [1.4 / 8] * 2, atol=1e-12
        )


class OpdBatch(unittest.TestCase):
    def sample(self, i, teacher):
        return Sample(
            tokens=np.array([5, 6, 7, 8, 9][: 2 + len(STUDENT[i])], dtype=np.int32),
            prompt_length=2,
            loss_mask=np.ones(len(STUDENT[i]), dtype=np.uint8),
            rollout_log_probs=np.array(STUDENT[i], dtype=np.float32),
            token_versions=np.zeros(len(STUDENT[i]), dtype=np.int32),
            reward=0.0,
            group_index=0,
            sample_index=i,
            teacher_log_probs=None
            if teacher is None
            else np.array(teacher, dtype=np.float32),
        )

    def test_teacher_log_probs_travel_in_the_batch_and_reach_the_advantage(self):
        batch = decode_batch(
            encode_batch(Batch("r", 0, [self.sample(i, TEACHER[i]) for i in range(2)]))
        )
        got = opd_teacher_log_probs(
            parse_algorithm({"use_opd": True}), batch.samples, MASK
        )
        np.testing.assert_allclose(
            got.flat, np.array(sum(TEACHER, []), dtype=np.float32)
        )
        self.assertIsNone(
            opd_teacher_log_probs(parse_algorithm({}), batch.samples, MASK)
        )

    def test_a_sample_without_teacher_log_probs_is_refused(self):
        with self.assertRaisesRegex(
            StepError, "sample 1 of group 0 has no teacher_log_probs"
        ):
            opd_teacher_log_probs(
                parse_algorithm({"use_opd": True}),
                [self.sample(0, TEACHER[0]), self.sample(1, None)],
                MASK,
            )


if __name__ == "__main__":
    unittest.main()


class OpdTorchStep(unittest.TestCase):
    """A real torch train step on the tiny model: the batch's teacher log-probs are what moves it."""

    def step(self, teacher_shift, **config):
        import tempfile

        from helpers import TINY_MODEL, make_batch, step_in_process
        from rlq_torch.trainer import TorchTrainer

        require("torch")
        b = make_batch("r", 0, seed=3)
        for s in b.samples:
            s.reward = 0.0
            if teacher_shift is not None:
                s.teacher_log_probs = s.rollout_log_probs + np.float32(teacher_shift)
        c = {
            "lr": 1e-3,
            "model": TINY_MODEL,
            "seed": 7,
            "use_rollout_logprobs": True,
            "num_steps_per_rollout": 1,
            **config,
        }
        trainer = TorchTrainer("cpu")
        with tempfile.TemporaryDirectory() as out:
            return step_in_process(trainer, b, c, out, defaults=trainer.defaults)

    def test_zero_reward_trains_only_through_the_teacher(self):
        # use_rollout_logprobs: the student's log-probs are the rollout's. Teacher = student: every advantage is 0.
        same = self.step(0.0, use_opd=True)
        self.assertEqual(same["metrics"]["pg_loss"], 0.0)
        self.assertEqual(same["metrics"]["grad_norm"], 0.0)
        # Without OPD a zero reward gives no gradient either; a teacher 0.5 nats above the student does.
        self.assertEqual(self.step(None)["metrics"]["grad_norm"], 0.0)
        moved = self.step(0.5, use_opd=True)
        self.assertGreater(moved["metrics"]["grad_norm"], 0.0)
        self.assertLess(
            moved["metrics"]["pg_loss"], 0.0
        )  # -A * ratio with A = +0.5 on every token
