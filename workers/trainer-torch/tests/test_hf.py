"""Hugging Face causal LMs: load a local directory, train, write a directory SGLang and transformers load, resume exactly."""
import glob
import json
import os
import tempfile
import unittest

import numpy as np

from helpers import make_batch, require

require("torch", "transformers")

TINY_QWEN2 = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 300, "max_position_embeddings": 128, "tie_word_embeddings": True}


class HuggingFaceTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        cls.tmp = tempfile.TemporaryDirectory()
        cls.base = os.path.join(cls.tmp.name, "base")
        cfg = AutoConfig.for_model(**TINY_QWEN2)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg)
        model.to(torch.bfloat16).save_pretrained(cls.base)
        with open(os.path.join(cls.base, "tokenizer_config.json"), "w") as f:
            json.dump({"model_max_length": 128}, f)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def step(self, trainer, step, uri, out, seed):
        from rlq_torch.trainer import parse_algorithm, parse_train_config

        cfg = {"lr": 1e-3, "use_kl_loss": True, "kl_loss_coef": 0.01, "ref_load": self.base}
        req = {"run_id": "hf", "step": step, "attempt": "0", "weight_version_in": step, "checkpoint_uri_in": uri, "output_dir": out, "config": cfg}
        return trainer.train_step(req, make_batch("hf", step, seed=seed), parse_train_config(cfg, {}), parse_algorithm(cfg), lambda *a: None, lambda: None)

    def test_train_write_load_resume(self):
        import torch
        from transformers import AutoModelForCausalLM

        from rlq_torch.safetensors_io import read_safetensors
        from rlq_torch.trainer import TorchTrainer

        d = self.tmp.name
        t1 = TorchTrainer("cpu")
        r0 = self.step(t1, 0, "file://" + self.base, f"{d}/v1", 1)
        self.assertEqual(r0["weight_version_out"], 1)
        self.assertAlmostEqual(r0["metrics"]["kl_loss"], 0.0, delta=1e-6)  # reference = the starting model
        files = sorted(os.listdir(f"{d}/v1"))
        self.assertEqual(files, ["config.json", "generation_config.json", "model.safetensors.index.json", "optimizer.safetensors", "tokenizer_config.json", "weights.safetensors"])
        meta, w = read_safetensors(f"{d}/v1/weights.safetensors")
        self.assertEqual((meta["format"], meta["version"]), ("pt", "1"))
        self.assertTrue(all(t.dtype == torch.bfloat16 for t in w.values()))
        with open(f"{d}/v1/model.safetensors.index.json") as f:
            index = json.load(f)
        self.assertEqual(set(index["weight_map"]), set(w))
        self.assertEqual(set(index["weight_map"].values()), {"weights.safetensors"})
        # SGLang's loader: glob *.safetensors, then keep the files the index names.
        kept = [f for f in glob.glob(f"{d}/v1/*.safetensors") if f in {os.path.join(f"{d}/v1", v) for v in index["weight_map"].values()}]
        self.assertEqual(kept, [f"{d}/v1/weights.safetensors"])
        # transformers loads the directory, with the trained weights.
        loaded = AutoModelForCausalLM.from_pretrained(f"{d}/v1", torch_dtype=torch.bfloat16)
        for n, p in loaded.named_parameters():
            self.assertTrue(torch.equal(p, w[n]), n)
        # Our log-probs (hidden states at response positions → head) equal the model's own logits.
        from rlq_torch.models import load_policy
        pol = load_policy(f"{d}/v1", torch.device("cpu"))
        s = make_batch("hf", 0, seed=3).samples[0]
        lp, _ = t1.token_stats(pol, [s], 1.0, grad=False)
        with torch.no_grad():
            logits = pol.module(torch.from_numpy(s.tokens[None, :-1].astype(np.int64))).logits[0].float()
        ref = torch.log_softmax(logits, -1)[torch.arange(s.prompt_length - 1, len(s.tokens) - 1), torch.from_numpy(s.tokens[s.prompt_length:].astype(np.int64))]
        self.assertTrue(torch.allclose(lp, ref, atol=1e-5))
        # Step 1 from memory equals step 1 after a reload (bf16 file + fp32 masters in the optimizer file).
        self.step(t1, 1, r0["checkpoint_uri"], f"{d}/v2-held", 2)
        self.step(TorchTrainer("cpu"), 1, r0["checkpoint_uri"], f"{d}/v2-disk", 2)
        for f in ("weights.safetensors", "optimizer.safetensors"):
            with open(f"{d}/v2-held/{f}", "rb") as a, open(f"{d}/v2-disk/{f}", "rb") as b:
                self.assertEqual(a.read(), b.read(), f)

    def test_bf16_output_and_gradient_checkpointing(self):
        """hf_save_dtype: bf16 writes BF16 weights and says so in config.json (what SGLang reads for the dtype), with fp32 masters
        in the optimizer file; gradient_checkpointing uses transformers' own and trains to the same weights."""
        import torch

        from rlq_torch.safetensors_io import read_safetensors
        from rlq_torch.trainer import TorchTrainer, parse_algorithm, parse_train_config

        d = self.tmp.name
        outs = {}
        for ckpt in (False, True):
            cfg = {"lr": 1e-3, "hf_save_dtype": "bf16", "gradient_checkpointing": ckpt}
            out = f"{d}/bf16-{ckpt}"
            req = {"run_id": "hf", "step": 0, "attempt": "0", "weight_version_in": 0, "checkpoint_uri_in": "file://" + self.base, "output_dir": out, "config": cfg}
            TorchTrainer("cpu").train_step(req, make_batch("hf", 0, seed=1), parse_train_config(cfg, {}), parse_algorithm(cfg), lambda *a: None, lambda: None)
            outs[ckpt] = out
        _, w = read_safetensors(f"{outs[False]}/weights.safetensors")
        self.assertTrue(all(t.dtype == torch.bfloat16 for t in w.values()))
        with open(f"{outs[False]}/config.json") as f:
            self.assertEqual(json.load(f)["torch_dtype"], "bfloat16")
        _, opt = read_safetensors(f"{outs[False]}/optimizer.safetensors")
        self.assertTrue(any(n.startswith("master.") and t.dtype == torch.float32 for n, t in opt.items()))
        _, w2 = read_safetensors(f"{outs[True]}/weights.safetensors")
        for n in w:
            self.assertTrue(torch.allclose(w[n].float(), w2[n].float(), atol=1e-2), n)


if __name__ == "__main__":
    unittest.main()
