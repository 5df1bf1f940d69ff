"""LoRA through peft on a tiny Qwen2 (lora.py): the keys' refusals, adapters-only optimizer state, merged weights equal
to peft's merge_and_unload (the weights file and the push path), the adapter loadable by PeftModel.from_pretrained,
a bit-exact resume, packing, and FSDP2 on 2 gloo ranks equal to 1 rank."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import urllib.request

from helpers import BatchServer, TrainerProcess, make_batch, request, require

require("torch", "transformers", "peft")

from test_distributed import CONFIG, _free_port, read, single_rank, tensors  # noqa: E402
from test_hf import TINY_QWEN2, run_step, save_base  # noqa: E402

LORA = {"lora_rank": 8, "lora_alpha": 16, "target_modules": "all-linear", "lr": 1e-2}


def merged_by_peft(base_dir, adapter_dir):
    """peft's own merge: PeftModel.from_pretrained on the base, then merge_and_unload (fp32)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    return PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()


class LoraTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="rlq-lora-test-")
        cls.base = os.path.join(cls.tmp, "base")
        save_base(TINY_QWEN2, cls.base)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def step(self, trainer, step, uri, out, seed=1, **config):
        res, _ = run_step(
            trainer,
            step,
            uri,
            os.path.join(self.tmp, out),
            seed,
            hf_checkpoint=self.base,
            hf_save_dtype="fp32",
            **{**LORA, **config},
        )
        return res

    def test_bad_keys_are_refused_with_the_key_named(self):
        from rlq_torch.train_config import StepError, parse_train_config

        cases = [
            ({"lora_rank": -1, "hf_checkpoint": "/m"}, "lora_rank"),
            ({"lora_rank": 8, "lora_alpha": 0, "hf_checkpoint": "/m"}, "lora_alpha"),
            (
                {"lora_rank": 8, "lora_dropout": 1.5, "hf_checkpoint": "/m"},
                "lora_dropout",
            ),
            (
                {"lora_rank": 8, "target_modules": [], "hf_checkpoint": "/m"},
                "target_modules",
            ),
            (
                {"lora_rank": 8, "target_modules": "q_proj", "hf_checkpoint": "/m"},
                "target_modules",
            ),
            ({"lora_alpha": 32, "hf_checkpoint": "/m"}, "lora_rank is 0"),
            ({"lora_rank": 8}, "Hugging Face"),
        ]
        for cfg, want in cases:
            with self.assertRaises(StepError, msg=cfg) as e:
                parse_train_config(cfg, {})
            self.assertIn(want, str(e.exception), cfg)
        self.assertIsNone(parse_train_config({"hf_checkpoint": "/m"}, {}).lora)

    def test_adapters_train_merged_weights_are_peft_merge_and_resume_is_bit_exact(self):
        import torch
        from peft import PeftModel
        from rlq_torch.trainer import TorchTrainer
        from transformers import AutoModelForCausalLM

        t1 = TorchTrainer("cpu")
        # version 0 from the base directory (rlq sends ref_load as the first checkpoint) equals version 0 from nothing
        r0 = self.step(t1, 0, f"file://{self.base}", "v1")
        v1 = r0["checkpoint_uri"].removeprefix("file://")
        self.step(TorchTrainer("cpu"), 0, None, "v1-init")
        self.assertEqual(
            read(f"{v1}/weights.safetensors"),
            read(f"{self.tmp}/v1-init/weights.safetensors"),
        )
        with open(f"{v1}/adapter/adapter_config.json") as f:
            self.assertEqual(
                json.load(f)["base_model_name_or_path"], self.base
            )  # what a resume (and peft) loads
        # only the adapters have optimizer state; the base is untouched in the policy
        opt = tensors(f"{v1}/optimizer.safetensors")
        names = {n.split(".", 1)[1] for n in opt if n.startswith("exp_avg.")}
        self.assertTrue(
            names and all(".lora_A." in n or ".lora_B." in n for n in names), names
        )
        self.assertEqual(
            len(names), 2 * 7 * TINY_QWEN2["num_hidden_layers"]
        )  # q k v o gate up down
        # the weights file: the merged model under the HF names, what peft's merge_and_unload gives
        w = tensors(f"{v1}/weights.safetensors")
        base_sd = AutoModelForCausalLM.from_pretrained(
            self.base, dtype=torch.float32
        ).state_dict()
        self.assertEqual(
            set(w),
            {n for n in base_sd if n != "lm_head.weight"}
            | ({"lm_head.weight"} & set(w)),
        )
        merged = merged_by_peft(self.base, f"{v1}/adapter").state_dict()
        moved = 0
        for n, t in w.items():
            self.assertTrue(torch.allclose(t, merged[n], atol=1e-6, rtol=0), n)
            moved += not torch.equal(t, base_sd[n])
        self.assertGreater(
            moved, 0
        )  # a step of lr 1e-2 moves the merged weights (B leaves zero)
        # the push path sends the same merged tensors
        pushed = dict(t1.held.policy.engine_params())
        self.assertEqual(set(pushed), set(w))
        for n, t in pushed.items():
            self.assertTrue(torch.allclose(t, merged[n], atol=1e-6, rtol=0), n)
        # the exported adapter gives the trainer's logits through peft
        ids = torch.tensor([[5, 17, 33, 2, 99, 4]])
        peft_model = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(self.base, dtype=torch.float32),
            f"{v1}/adapter",
        ).eval()
        held = t1.held.policy.module
        held.eval()
        with torch.no_grad():
            self.assertTrue(
                torch.allclose(peft_model(ids).logits, held(ids).logits, atol=1e-5)
            )
        held.train()
        # resume: step 1 from memory equals step 1 in a fresh trainer from the checkpoint, byte for byte
        self.step(t1, 1, r0["checkpoint_uri"], "v2-held", seed=2)
        self.step(TorchTrainer("cpu"), 1, r0["checkpoint_uri"], "v2-disk", seed=2)
        for f in (
            "weights.safetensors",
            "optimizer.safetensors",
            "adapter/adapter_model.safetensors",
        ):
            self.assertEqual(
                read(f"{self.tmp}/v2-held/{f}"), read(f"{self.tmp}/v2-disk/{f}"), f
            )
        # a LoRA run refuses a checkpoint that has no adapter
        with self.assertRaises(Exception) as e:
            self.step(
                TorchTrainer("cpu"), 1, f"file://{self.base}", "v2-bad", lora_rank=8
            )
        self.assertIn("adapter", str(e.exception))

    def test_packed_and_padded_steps_agree(self):
        import torch
        from rlq_torch.trainer import TorchTrainer

        self.step(TorchTrainer("cpu"), 0, None, "pad")
        self.step(
            TorchTrainer("cpu"),
            0,
            None,
            "pack",
            use_dynamic_batch_size=True,
            max_tokens_per_gpu=256,
        )
        a = tensors(f"{self.tmp}/pad/adapter/adapter_model.safetensors")
        b = tensors(f"{self.tmp}/pack/adapter/adapter_model.safetensors")
        for n in a:
            self.assertTrue(torch.allclose(a[n], b[n], atol=1e-5, rtol=0), n)


class LoraFsdpTest(unittest.TestCase):
    """--nproc 2 --sharding fsdp (FSDP2, gloo on CPU) with LoRA: the one-rank adapters and merged weights within 1e-5,
    adapters-only optimizer shards, and rank 0 pushing the merged weights it gathers."""

    def test_two_fsdp2_ranks_train_the_one_rank_adapters_and_push_merged_weights(self):
        import torch
        from rlq_torch.fsdp import resolve

        self.assertEqual(resolve("fsdp"), "fsdp2")
        tmp = tempfile.mkdtemp(prefix="rlq-lora-fsdp-")
        self.addCleanup(shutil.rmtree, tmp, True)
        base = os.path.join(tmp, "base")
        save_base(TINY_QWEN2, base)
        cfg = {**CONFIG, **LORA, "hf_checkpoint": base, "hf_save_dtype": "fp32"}
        batches = BatchServer()
        self.addCleanup(batches.close)
        here = os.path.dirname(os.path.abspath(__file__))
        engine_proc = subprocess.Popen(
            [sys.executable, os.path.join(here, "fake_push_engine.py"), "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.addCleanup(engine_proc.stdout.close)
        self.addCleanup(engine_proc.wait)
        self.addCleanup(engine_proc.kill)
        engine = f"http://127.0.0.1:{engine_proc.stdout.readline().split()[1]}"
        tr = TrainerProcess(
            "--nproc", "2", "--sharding", "fsdp", "--push-engines", engine,
            "--push-backend", "gloo", "--push-master-port", str(_free_port()),
        )  # fmt: skip
        outs, batch_list = [], []
        try:
            uri = None
            for step in (0, 1):
                b = make_batch("lora", step, groups=4, per_group=4, seed=step + 1)
                out = os.path.join(tmp, "two", str(step))
                r = request(
                    "lora", step, "a", out, batches.add(f"s{step}", b), cfg, uri=uri
                )
                code, st = tr.call("POST", "/v1/steps", r)
                self.assertEqual(code, 202, st)
                st = tr.wait("lora", step, timeout=300)
                self.assertEqual(st["state"], "done", st)
                outs.append(out)
                batch_list.append(b)
                uri = f"file://{out}"
            self.assertNotIn("error", st["result"]["weight_push"])
        finally:
            tr.close()
        uri = None
        for step, b in enumerate(batch_list):
            one = os.path.join(tmp, "one", str(step))
            single_rank(one, b, uri=uri, **cfg)
            uri = f"file://{one}"
            for f in ("weights.safetensors", "adapter/adapter_model.safetensors"):
                wa, wb = tensors(f"{outs[step]}/{f}"), tensors(f"{one}/{f}")
                self.assertEqual(sorted(wa), sorted(wb), f)
                for n in wa:
                    d = float((wa[n] - wb[n]).abs().max())
                    self.assertLessEqual(d, 1e-5, f"{f} {n}: max diff {d}")
        # each rank's optimizer shard holds adapter moments only
        for k in (1, 2):
            names = tensors(f"{outs[1]}/optimizer-0000{k}-of-00002.safetensors")
            self.assertTrue(all(".lora_" in n for n in names if n.startswith("exp_")))
        # rank 0 pushed the merged weights of version 2 (what the weights file holds)
        with urllib.request.urlopen(f"{engine}/received", timeout=30) as resp:
            got = json.loads(resp.read())
        self.assertEqual(got["version"], "2")
        w = tensors(f"{outs[1]}/weights.safetensors")
        self.assertEqual(set(got["tensors"]), set(w))
        for n, t in w.items():
            self.assertEqual(
                got["tensors"][n]["values"], t.to(torch.float64).flatten().tolist(), n
            )


if __name__ == "__main__":
    unittest.main()
