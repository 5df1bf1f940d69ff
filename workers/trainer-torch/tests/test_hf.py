"""Hugging Face causal LMs, tiny Qwen2 and Llama configs (random init, built here): load a local directory, train,
write a directory SGLang and transformers load (with the trainer's logits), resume bit-identically, and pack rows
(use_dynamic_batch_size) with the padded computation's loss and gradients; a model that cannot pack is refused."""

import copy
import glob
import json
import os
import tempfile
import unittest

import numpy as np
from helpers import make_batch, require

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
TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 300,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
}
TINY_MAMBA = {
    "model_type": "mamba",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "vocab_size": 300,
    "state_size": 8,
}


def save_base(config, path, seed=0):
    """A HF model directory as `save_pretrained` writes it (bf16 weights), plus a tokenizer file the trainer copies."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    model.to(torch.bfloat16).save_pretrained(path)
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"model_max_length": 128}, f)


def run_step(trainer, step, uri, out, seed, **config):
    from rlq_torch.trainer import parse_algorithm, parse_train_config

    cfg = {"lr": 1e-3, **config}
    req = {
        "run_id": "hf",
        "step": step,
        "attempt": "0",
        "weight_version_in": step,
        "checkpoint_uri_in": uri,
        "output_dir": out,
        "config": cfg,
    }
    phases = []
    res = trainer.train_step(
        req,
        make_batch("hf", step, seed=seed),
        parse_train_config(cfg, {}),
        parse_algorithm(cfg),
        lambda done, total, phase: phases.append(phase),
        lambda: None,
    )
    return res, phases


def read(path):
    with open(path, "rb") as f:
        return f.read()


class HFCases:
    """The same tests for each architecture (subclasses set CONFIG)."""

    CONFIG: dict = {}

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.base = os.path.join(cls.tmp.name, "base")
        save_base(cls.CONFIG, cls.base)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def step(self, trainer, step, uri, out, seed, **config):
        return run_step(
            trainer,
            step,
            uri,
            out,
            seed,
            use_kl_loss=True,
            kl_loss_coef=0.01,
            ref_load=self.base,
            **config,
        )[0]

    def test_train_write_load_resume(self):
        import torch
        from rlq_torch.models import load_policy
        from rlq_torch.safetensors_io import read_safetensors
        from rlq_torch.trainer import TorchTrainer
        from transformers import AutoModelForCausalLM

        d = self.tmp.name
        t1 = TorchTrainer("cpu")
        r0 = self.step(t1, 0, "file://" + self.base, f"{d}/v1", 1)
        self.assertEqual(r0["weight_version_out"], 1)
        self.assertAlmostEqual(
            r0["metrics"]["kl_loss"], 0.0, delta=1e-6
        )  # reference = the starting model
        files = sorted(os.listdir(f"{d}/v1"))
        self.assertEqual(
            files,
            [
                "config.json",
                "generation_config.json",
                "model.safetensors.index.json",
                "optimizer.safetensors",
                "tokenizer_config.json",
                "weights.safetensors",
            ],
        )
        meta, w = read_safetensors(f"{d}/v1/weights.safetensors")
        self.assertEqual((meta["format"], meta["version"]), ("pt", "1"))
        self.assertTrue(all(t.dtype == torch.bfloat16 for t in w.values()))
        with open(f"{d}/v1/model.safetensors.index.json") as f:
            index = json.load(f)
        self.assertEqual(set(index["weight_map"]), set(w))
        self.assertEqual(set(index["weight_map"].values()), {"weights.safetensors"})
        # SGLang's loader: glob *.safetensors, then keep the files the index names.
        kept = [
            f
            for f in glob.glob(f"{d}/v1/*.safetensors")
            if f in {os.path.join(f"{d}/v1", v) for v in index["weight_map"].values()}
        ]
        self.assertEqual(kept, [f"{d}/v1/weights.safetensors"])
        # transformers loads the directory, with the trained weights, and computes the trainer's logits: the model the
        # trainer holds, its fp32 masters rounded to the saved bf16, gives the same numbers bit for bit (both in fp32).
        loaded = AutoModelForCausalLM.from_pretrained(f"{d}/v1", dtype=torch.bfloat16)
        for n, p in loaded.named_parameters():
            self.assertTrue(torch.equal(p, w[n]), n)
        loaded32 = AutoModelForCausalLM.from_pretrained(
            f"{d}/v1", dtype=torch.float32
        ).eval()
        held = copy.deepcopy(t1.held.policy.module).eval()
        with torch.no_grad():
            for p in held.parameters():
                p.copy_(p.to(torch.bfloat16).float())
        s = make_batch("hf", 0, seed=3).samples[0]
        ids = torch.from_numpy(s.tokens[None, :-1].astype(np.int64))
        with torch.no_grad():
            self.assertTrue(torch.equal(loaded32(ids).logits, held(ids).logits))
        # Our log-probs (hidden states at response positions → head) equal the model's own logits.
        pol = load_policy(f"{d}/v1", torch.device("cpu"))
        lp, _ = t1.token_stats(pol, [s], 1.0, grad=False)
        with torch.no_grad():
            logits = pol.module(ids).logits[0].float()
        ref = torch.log_softmax(logits, -1)[
            torch.arange(s.prompt_length - 1, len(s.tokens) - 1),
            torch.from_numpy(s.tokens[s.prompt_length :].astype(np.int64)),
        ]
        self.assertTrue(torch.allclose(lp, ref, atol=1e-5))
        # Step 1 from memory equals step 1 after a restart (a fresh trainer reloading the bf16 file + fp32 masters), bit for bit.
        self.step(t1, 1, r0["checkpoint_uri"], f"{d}/v2-held", 2)
        self.step(TorchTrainer("cpu"), 1, r0["checkpoint_uri"], f"{d}/v2-disk", 2)
        for f in ("weights.safetensors", "optimizer.safetensors"):
            self.assertEqual(read(f"{d}/v2-held/{f}"), read(f"{d}/v2-disk/{f}"), f)

    def test_bf16_output_and_gradient_checkpointing(self):
        """hf_save_dtype: bf16 writes BF16 weights and says so in config.json (what SGLang reads for the dtype), with fp32 masters
        in the optimizer file; gradient_checkpointing uses transformers' own and trains to the same weights."""
        import torch
        from rlq_torch.safetensors_io import read_safetensors
        from rlq_torch.trainer import TorchTrainer
        from transformers import AutoConfig

        d = self.tmp.name
        outs = {}
        for ckpt in (False, True):
            out = f"{d}/bf16-{ckpt}"
            run_step(
                TorchTrainer("cpu"),
                0,
                "file://" + self.base,
                out,
                1,
                hf_save_dtype="bf16",
                gradient_checkpointing=ckpt,
            )
            outs[ckpt] = out
        _, w = read_safetensors(f"{outs[False]}/weights.safetensors")
        self.assertTrue(all(t.dtype == torch.bfloat16 for t in w.values()))
        with open(f"{outs[False]}/config.json") as f:
            cfg = json.load(f)
        self.assertEqual((cfg["dtype"], cfg["torch_dtype"]), ("bfloat16", "bfloat16"))
        self.assertEqual(AutoConfig.from_pretrained(outs[False]).dtype, torch.bfloat16)
        _, opt = read_safetensors(f"{outs[False]}/optimizer.safetensors")
        self.assertTrue(
            any(
                n.startswith("master.") and t.dtype == torch.float32
                for n, t in opt.items()
            )
        )
        _, w2 = read_safetensors(f"{outs[True]}/weights.safetensors")
        for n in w:
            self.assertTrue(torch.allclose(w[n].float(), w2[n].float(), atol=1e-2), n)

    def loss_and_grads(self, attn, packed, max_tokens):
        """The full train-step loss (rlq/algorithms' denominators: each sample's mask sum, N) over micro-batches."""
        import torch
        from rlq_torch import algorithms as A
        from rlq_torch.micro_batching import use_packing
        from rlq_torch.models import hf_from_config
        from rlq_torch.train_config import TrainConfig
        from rlq_torch.trainer import TorchTrainer, micro_batches, packed_micro_batches

        trainer = TorchTrainer("cpu")
        policy = hf_from_config(
            {**self.CONFIG, "attn_implementation": attn}, torch.device("cpu"), 11
        )
        self.assertEqual(policy.module.config._attn_implementation, attn)
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
        self.assertEqual(
            use_packing(policy, TrainConfig(use_dynamic_batch_size=packed)), packed
        )  # the probe passes
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
                shape.slice(lo, hi).like(lp.detach().double().numpy()),
                adv[a:b],
                mask[a:b],
                o,
                old=old[a:b],
                ref=old[a:b] + 0.1,
                entropy=en.detach().double().numpy(),
                sample_denominators=own[lo:hi],
                normalizer=float(len(samples)),
            )
            (lp * torch.from_numpy(terms.dloss_dlogp).float()).sum().add(
                (en * torch.from_numpy(terms.dloss_dentropy).float()).sum()
            ).backward()
            loss += terms.loss
        return loss, {n: p.grad.clone() for n, p in policy.named_params()}, mbs

    def test_packed_and_padded_give_the_same_loss_and_gradients(self):
        """use_dynamic_batch_size on a HF model: one row per micro-batch, position_ids restarting at 0 per sequence,
        no attention_mask (transformers builds the block-diagonal causal mask); loss and every gradient within 1e-5
        of padded micro-batches, for sdpa and eager attention."""
        for attn, budget in (
            ("sdpa", 60),
            ("sdpa", 200),
            ("eager", 60),
        ):  # several rows, and the whole batch in one
            with self.subTest(attn=attn, max_tokens_per_gpu=budget):
                l0, g0, mbs0 = self.loss_and_grads(attn, False, budget)
                l1, g1, mbs1 = self.loss_and_grads(attn, True, budget)
                self.assertLess(
                    len(mbs1), len(mbs0)
                )  # no padding: fewer, fuller micro-batches
                self.assertNotEqual(l0, 0.0)
                self.assertLessEqual(abs(l0 - l1), 1e-5, (l0, l1))
                worst = max(float((g0[n] - g1[n]).abs().max()) for n in g0)
                self.assertLessEqual(worst, 1e-5, f"max gradient difference {worst}")
                self.assertTrue(
                    all(g0[n].abs().max() > 0 for n in g0 if "embed_tokens" not in n)
                )

    def test_a_train_step_packs_its_micro_batches(self):
        import torch
        from rlq_torch.safetensors_io import read_safetensors
        from rlq_torch.trainer import TorchTrainer

        d = self.tmp.name
        out = {}
        for packed in (False, True):
            res, phases = run_step(
                TorchTrainer("cpu"),
                0,
                "file://" + self.base,
                f"{d}/packed-{packed}",
                8,
                max_tokens_per_gpu=48,
                use_dynamic_batch_size=packed,
                entropy_coef=0.01,
                hf_save_dtype="fp32",
            )
            out[packed] = (
                res,
                read_safetensors(f"{d}/packed-{packed}/weights.safetensors")[1],
                sum(p.startswith("train") for p in phases),
            )
        (r0, w0, n0), (r1, w1, n1) = out[False], out[True]
        self.assertLess(n1, n0)
        for k in ("pg_loss", "entropy_loss", "loss"):
            self.assertAlmostEqual(
                r0["metrics"][k], r1["metrics"][k], delta=1e-5, msg=k
            )
        for n in w0:
            self.assertTrue(torch.allclose(w0[n], w1[n], atol=1e-5, rtol=0), n)

    def test_ppo_trains_a_critic_on_the_base_model_and_resumes_bit_identically(self):
        """advantage_estimator: ppo on a HF policy: the critic is the policy's base model plus a value head, committed
        with each step (rlq-hf-critic-v1), learning the returns in critic-only steps, and a step resumed from the files
        (a fresh trainer) writes the files of the step trained from memory, critic included, bit for bit."""
        from rlq_torch.safetensors_io import read_metadata, read_safetensors
        from rlq_torch.trainer import TorchTrainer
        from transformers import AutoModel

        d = self.tmp.name
        cfg = {
            "advantage_estimator": "ppo",
            "value_clip": 0.5,
            "gamma": 1.0,
            "lambd": 1.0,
            "critic_lr": 3e-3,
            "max_tokens_per_gpu": 60,
            "num_critic_only_steps": 3,
        }
        t1 = TorchTrainer("cpu")
        uri = "file://" + self.base
        losses = []
        for step in range(
            3
        ):  # the same batch (seed 3) each time, the critic only: its loss must fall
            res, _ = run_step(t1, step, uri, f"{d}/ppo{step}", 3, **cfg)
            self.assertEqual(res["metrics"]["critic_only"], 1.0)
            losses.append(res["metrics"]["value_loss"])
            uri = res["checkpoint_uri"]
        self.assertLess(losses[-1], losses[0], losses)
        meta, critic = read_safetensors(f"{d}/ppo2/critic/weights.safetensors")
        self.assertEqual(meta["format"], "rlq-hf-critic-v1")
        trunk_names = [
            n
            for n, _ in AutoModel.from_config(
                t1.held.policy.module.config
            ).named_parameters()
        ]
        self.assertEqual(
            list(critic), trunk_names + ["value_head.weight", "value_head.bias"]
        )
        self.assertTrue(bool((critic["value_head.weight"] != 0).any()))
        self.assertEqual(
            read_metadata(f"{d}/ppo2/critic/optimizer.safetensors")["iteration"], "3"
        )
        _, w0 = read_safetensors(f"{d}/ppo0/weights.safetensors")
        _, w2 = read_safetensors(f"{d}/ppo2/weights.safetensors")
        self.assertTrue(
            all(bool((w0[n] == w2[n]).all()) for n in w0)
        )  # critic-only steps carry the policy unchanged
        held, _ = run_step(t1, 3, uri, f"{d}/ppo3-held", 4, **cfg)
        self.assertEqual(held["metrics"]["critic_only"], 0.0)
        run_step(TorchTrainer("cpu"), 3, uri, f"{d}/ppo3-disk", 4, **cfg)
        for f in (
            "weights.safetensors",
            "optimizer.safetensors",
            "critic/weights.safetensors",
            "critic/optimizer.safetensors",
        ):
            self.assertEqual(read(f"{d}/ppo3-held/{f}"), read(f"{d}/ppo3-disk/{f}"), f)


class Qwen2Test(HFCases, unittest.TestCase):
    CONFIG = TINY_QWEN2


class LlamaTest(HFCases, unittest.TestCase):
    CONFIG = TINY_LLAMA


class PackingRefusalTest(unittest.TestCase):
    def test_a_model_whose_state_crosses_sequences_is_refused_not_padded(self):
        """Mamba has no attention mask to restart: packed rows would leak one sequence's state into the next.
        The trainer's probe sees it and the step fails with bad_request naming use_dynamic_batch_size."""
        from rlq_torch.trainer import StepError, TorchTrainer

        with tempfile.TemporaryDirectory() as d:
            save_base(TINY_MAMBA, f"{d}/mamba")
            with self.assertRaises(StepError) as e:
                run_step(
                    TorchTrainer("cpu"),
                    0,
                    f"file://{d}/mamba",
                    f"{d}/out",
                    1,
                    max_tokens_per_gpu=48,
                    use_dynamic_batch_size=True,
                )
            self.assertEqual(e.exception.code, "bad_request")
            self.assertIn(
                "use_dynamic_batch_size: true needs packed rows", str(e.exception)
            )
            self.assertIn("use_dynamic_batch_size: false", str(e.exception))
            self.assertEqual(
                os.listdir(f"{d}/out") if os.path.isdir(f"{d}/out") else [], []
            )
            run_step(
                TorchTrainer("cpu"),
                0,
                f"file://{d}/mamba",
                f"{d}/padded",
                1,
                max_tokens_per_gpu=48,
            )  # padded: it trains

    def test_an_attention_implementation_transformers_does_not_pack_is_refused(self):
        import torch
        from rlq_torch.models import hf_from_config

        policy = hf_from_config(TINY_QWEN2, torch.device("cpu"), 0)
        policy.module.config._attn_implementation = "paged_attention"
        why = policy.packing_unsupported()
        self.assertIn("'paged_attention'", why)
        self.assertIn("sdpa", why)


if __name__ == "__main__":
    unittest.main()
