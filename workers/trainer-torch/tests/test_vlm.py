"""Vision-language models in the torch trainer: a tiny random Qwen2-VL (scripts/make-tiny-vlm.py) trains through the
same step as a text model. The model's processor builds pixel_values and image_grid_thw from the batch's images and
gives the rollout's prompt ids back (placeholders expanded); a train step is finite and moves the weights; vision
tokens carry no loss weight; a wrong image hash, prompt ids the processor does not give and packed rows are refused."""

import copy
import hashlib
import importlib.util
import io
import os
import tempfile
import unittest

import numpy as np
from helpers import ROOT, require, step_in_process

require("torch", "transformers", "PIL")

from rlq_torch.batch import Batch, BatchImage, Sample, decode_batch, encode_batch  # noqa: E402

REPO = os.path.dirname(os.path.dirname(ROOT))


def tiny_vlm_module():
    spec = importlib.util.spec_from_file_location(
        "make_tiny_vlm", os.path.join(REPO, "scripts", "make-tiny-vlm.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def png(
    width: int, height: int, rgb: tuple[int, int, int], square: bool = False
) -> bytes:
    """A PNG with a coloured background (and a white square in its middle when ``square``)."""
    from PIL import Image

    a = np.zeros((height, width, 3), dtype=np.uint8)
    a[:] = rgb
    if square:
        a[height // 4 : 3 * height // 4, width // 4 : 3 * width // 4] = 255
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()


def image(data: bytes) -> BatchImage:
    return BatchImage(hashlib.sha256(data).hexdigest(), "image/png", data)


def rollout_prompt_ids(tok, text: str, n_images: int) -> list[int]:
    """What rlq's rollout side sends the engine: the chat template over a content-part user turn (the text, then one
    image part per image; src/data/chat-template.ts), tokenized as text, one placeholder per image."""
    parts = [{"type": "text", "text": text}] + [{"type": "image"}] * n_images
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": parts}], tokenize=False, add_generation_prompt=True
    )
    return tok.encode(rendered, add_special_tokens=False)


class VisionCase(unittest.TestCase):
    ARCH = "qwen2_vl"

    @classmethod
    def setUpClass(cls):
        from rlq_torch.vlm import load_processor

        cls.tmp = tempfile.TemporaryDirectory()
        cls.base = tiny_vlm_module().write_tiny_vlm(
            os.path.join(cls.tmp.name, "base"), seed=0, arch=cls.ARCH
        )
        cls.processor = load_processor(cls.base)
        cls.tok = cls.processor.tokenizer
        cls.red = png(56, 56, (200, 30, 30), square=True)
        cls.blue = png(84, 56, (30, 30, 200))
        cls.eos = cls.tok.convert_tokens_to_ids("<|im_end|>")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def sample(self, text, images, response, group=0, index=0, reward=1.0, mask=None):
        prompt = rollout_prompt_ids(self.tok, text, len(images))
        r = len(response)
        return Sample(
            np.array(prompt + response, dtype=np.int32),
            len(prompt),
            np.ones(r, dtype=np.uint8)
            if mask is None
            else np.array(mask, dtype=np.uint8),
            np.full(r, -2.0, dtype=np.float32),
            np.zeros(r, dtype=np.int32),
            reward,
            group,
            index,
            images=[image(x) for x in images],
        )

    def answer(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False) + [self.eos]

    def batch(self) -> Batch:
        """Two groups of two, each group's prompt with its own images, sent through the RLQB codec."""
        s = [
            self.sample(
                "Which is larger?", [self.red, self.blue], self.answer("red"), 0, 0, 1.0
            ),
            self.sample(
                "Which is larger?",
                [self.red, self.blue],
                self.answer("blue"),
                0,
                1,
                0.0,
            ),
            self.sample("How many squares?", [self.red], self.answer("1"), 1, 0, 1.0),
            self.sample(
                "How many squares?", [self.red], self.answer("2 squares"), 1, 1, 0.0
            ),
        ]
        return decode_batch(encode_batch(Batch("vlm", 0, s)))


class TestProcessor(VisionCase):
    def test_without_torchvision_the_processor_is_the_models_class_with_the_pil_image_processor(
        self,
    ):
        import importlib.util as u

        self.assertEqual(type(self.processor).__name__, "Qwen2VLProcessor")
        if u.find_spec("torchvision") is None:
            self.assertEqual(
                type(self.processor.image_processor).__name__,
                "Qwen2VLImageProcessorPil",
            )

    def test_the_same_prompt_gives_the_rollouts_ids_and_the_processors_pixel_values(
        self,
    ):
        import torch
        from rlq_torch.vlm import VisionInputs

        s = self.sample("Which is larger?", [self.red, self.blue], self.answer("red"))
        x = VisionInputs(self.processor).expand_sample(s, 0)
        # The processor run directly, as slime's processing_utils runs it on the rendered prompt.
        from PIL import Image

        rendered = self.tok.decode(
            s.tokens[: s.prompt_length].tolist(), skip_special_tokens=False
        )
        ims = [Image.open(io.BytesIO(b)).convert("RGB") for b in (self.red, self.blue)]
        ref = self.processor(text=[rendered], images=ims, return_tensors="pt")
        self.assertEqual(
            x.tokens[: x.prompt_length].tolist(), ref["input_ids"][0].tolist()
        )
        self.assertTrue(torch.equal(x.vision["pixel_values"], ref["pixel_values"]))
        self.assertEqual(x.vision["image_grid_thw"].tolist(), [[1, 4, 4], [1, 4, 6]])
        # The rollout's prompt with each placeholder expanded by its image's merged patches (16/4, 24/4).
        pad = self.processor.image_token_id
        want = []
        counts = iter([4, 6])
        for t in s.tokens[: s.prompt_length].tolist():
            want += [t] * (next(counts) if t == pad else 1)
        self.assertEqual(x.tokens[: x.prompt_length].tolist(), want)
        # The response is the rollout's, untouched, and read back at the same positions.
        self.assertEqual(
            x.tokens[x.prompt_length :].tolist(), s.tokens[s.prompt_length :].tolist()
        )
        self.assertEqual(x.loss_mask.tolist(), s.loss_mask.tolist())

    def test_the_batch_carries_each_image_once_and_each_samples_images_in_order(self):
        b = self.batch()
        raw = encode_batch(b)
        self.assertEqual(raw.count(self.red), 1)
        self.assertEqual(raw.count(self.blue), 1)
        self.assertEqual([len(s.images) for s in b.samples], [2, 2, 1, 1])
        self.assertEqual(b.samples[0].images[1].data, self.blue)

    def test_a_wrong_image_hash_is_a_bad_request_naming_the_sample(self):
        from rlq_torch.trainer import StepError
        from rlq_torch.vlm import VisionInputs

        s = self.sample(
            "How many squares?", [self.red], self.answer("1"), group=3, index=1
        )
        s.images[0] = BatchImage(
            hashlib.sha256(self.blue).hexdigest(), "image/png", self.red
        )
        with self.assertRaises(StepError) as e:
            VisionInputs(self.processor).expand_sample(s, 7)
        self.assertEqual(e.exception.code, "bad_request")
        self.assertIn("sample 7 (group 3, sample_index 1) image 0", str(e.exception))
        self.assertIn("not the one the rollout used", str(e.exception))

    def test_prompt_ids_the_processor_does_not_give_are_refused(self):
        from rlq_torch.trainer import StepError
        from rlq_torch.vlm import VisionInputs

        s = self.sample("How many squares?", [self.red], self.answer("1"))
        # A rollout whose tokenizer does not know "<|im_start|>" as one token would send its bytes; the model's
        # processor reads the same text as the special token.
        start = self.tok.convert_tokens_to_ids("<|im_start|>")
        self.assertEqual(int(s.tokens[0]), start)
        as_bytes = [self.tok.convert_tokens_to_ids(c) for c in "<|im_start|>"]
        s.tokens = np.concatenate([np.array(as_bytes, dtype=np.int32), s.tokens[1:]])
        s.prompt_length += len(as_bytes) - 1
        with self.assertRaises(StepError) as e:
            VisionInputs(self.processor).expand_sample(s, 2)
        self.assertIn("sample 2", str(e.exception))
        self.assertIn("other prompt ids than the rollout used", str(e.exception))

    def test_images_and_placeholders_must_agree(self):
        from rlq_torch.trainer import StepError
        from rlq_torch.vlm import VisionInputs

        s = self.sample("How many squares?", [self.red], self.answer("1"))
        s.images.append(image(self.blue))
        with self.assertRaises(StepError) as e:
            VisionInputs(self.processor).expand_sample(s, 0)
        self.assertIn("2 image(s) for 1 image placeholder(s)", str(e.exception))


class TestTrainStep(VisionCase):
    def run_step(self, batch, out, **config):
        from rlq_torch.trainer import TorchTrainer

        cfg = {"lr": 1e-2, "hf_checkpoint": self.base, **config}
        return step_in_process(TorchTrainer("cpu"), batch, cfg, out)

    def step_dir(self, name: str) -> str:
        """A new directory under this class's temp dir for one step's output."""
        out = os.path.join(self.tmp.name, name)
        os.makedirs(out)
        return out

    def run_pair_step(self, s: Sample, name: str) -> dict:
        """One step on a group of two: ``s`` and a copy scored 0, so the group has a reward spread and
        trains, sent through the RLQB codec as the server receives it."""
        other = copy.deepcopy(s)
        other.sample_index, other.reward = 1, 0.0
        batch = decode_batch(encode_batch(Batch("vlm", 0, [s, other])))
        return self.run_step(batch, self.step_dir(name))

    def test_a_train_step_on_the_tiny_vlm_is_finite_and_moves_the_weights(self):
        from rlq_torch.models import load_policy

        b = self.batch()
        out = self.step_dir("step1")
        res = self.run_step(b, out)
        m = res["metrics"]
        for k in ("pg_loss", "grad_norm", "entropy_loss"):
            self.assertIn(k, m)
            self.assertTrue(np.isfinite(m[k]), k)
        self.assertGreater(m["grad_norm"], 0)
        # The loss covers the response tokens the batch masks in, not one vision token.
        self.assertEqual(
            res["num_tokens"], sum(int(s.loss_mask.sum()) for s in b.samples)
        )
        # Old log-probs come back per sample at its own response positions.
        self.assertEqual(
            [len(x) for x in res["old_log_probs"]],
            [s.response_length for s in b.samples],
        )
        self.assertTrue(all(np.isfinite(x).all() for x in res["old_log_probs"]))
        before = dict(
            load_policy(self.base, __import__("torch").device("cpu")).named_params()
        )
        after = load_policy(out, __import__("torch").device("cpu"))
        self.assertEqual(
            type(after).__name__, "VLMPolicy"
        )  # the saved directory loads as a VLM with its processor
        moved = {
            n: float((p.detach() - before[n].detach()).abs().max())
            for n, p in after.named_params()
        }
        self.assertGreater(max(v for n, v in moved.items() if "visual" in n), 0)
        self.assertGreater(max(v for n, v in moved.items() if "language_model" in n), 0)

    def test_vision_tokens_carry_no_loss_weight(self):
        """The step's log-probs are those of the response tokens only (a prompt's vision tokens are never a target), and an
        image observation inside the response (multi-turn) is expanded with loss mask 0 and read back at the batch's
        own response positions."""
        from types import SimpleNamespace

        import torch
        from rlq_torch.models import load_policy
        from rlq_torch.trainer import TorchTrainer

        policy = load_policy(self.base, torch.device("cpu"))
        obs = self.tok.encode(
            "<|vision_start|><|image_pad|><|vision_end|>", add_special_tokens=False
        )
        resp = self.answer("look")[:-1] + obs + self.answer("red")
        mask = [1] * 4 + [0] * len(obs) + [1] * (len(resp) - 4 - len(obs))
        s = self.sample("Which?", [self.red], resp, mask=mask)
        s.token_versions[
            4 : 4 + len(obs)
        ] = -1  # an observation: not generated by the policy
        s.images.append(image(self.blue))
        x = policy.vision_inputs.expand_sample(s, 0)
        pad = self.processor.image_token_id
        vision_at = np.flatnonzero(x.tokens == pad)
        self.assertEqual(
            len(vision_at), 4 + 6
        )  # 56x56 px: 4 tokens in the prompt; 84x56 px: 6 in the response
        in_response = vision_at[vision_at >= x.prompt_length] - x.prompt_length
        self.assertEqual(len(in_response), 6)
        self.assertEqual(x.loss_mask[in_response].tolist(), [0] * 6)
        self.assertEqual(x.token_versions[in_response].tolist(), [-1] * 6)
        self.assertEqual(int(x.loss_mask.sum()), int(s.loss_mask.sum()))
        t = TorchTrainer("cpu")
        lp, _ = t.token_stats(policy, [x], 1.0, grad=False)
        self.assertEqual(
            lp.shape[0], x.response_length
        )  # one per response token: no prompt (vision) position
        self.assertTrue(torch.isfinite(lp).all())
        c = SimpleNamespace(
            shape=SimpleNamespace(offsets=np.array([0, x.response_length])),
            old=lp.double().numpy(),
        )
        back = t._old_log_probs_in_request_order(c, [x], Batch("vlm", 0, [s]))[0]
        self.assertEqual(len(back), s.response_length)
        self.assertEqual(back, lp.double().numpy()[x.response_index].tolist())
        # Through a whole step: the loss counts the batch's masked-in response tokens, no vision token.
        res = self.run_pair_step(s, "multiturn")
        self.assertEqual(res["num_tokens"], 2 * int(s.loss_mask.sum()))
        self.assertEqual(
            [len(v) for v in res["old_log_probs"]], [s.response_length] * 2
        )
        self.assertTrue(np.isfinite(res["metrics"]["pg_loss"]))

    def test_a_placeholder_the_policy_sampled_ends_the_samples_loss_there(self):
        """The policy may sample <|image_pad|> as an ordinary token; the sample is no image observation, and it
        trains up to that token: the forward runs (no image is looked for there) and no later token is in the loss."""
        import torch
        from rlq_torch.models import load_policy
        from rlq_torch.trainer import TorchTrainer

        policy = load_policy(self.base, torch.device("cpu"))
        pad = self.processor.image_token_id
        resp = self.answer("ab")[:-1] + [pad] + self.answer("c")
        s = self.sample("Which?", [self.red], resp)
        x = policy.vision_inputs.expand_sample(s, 0)
        self.assertEqual(
            x.response_length, len(resp)
        )  # nothing expanded in the response
        self.assertEqual(x.loss_mask.tolist(), [1, 1] + [0] * (len(resp) - 2))
        self.assertNotIn(pad, x.tokens[x.prompt_length :].tolist())
        self.assertEqual(int((x.tokens == pad).sum()), 4)  # the prompt's image only
        self.assertEqual(
            s.loss_mask.tolist(), [1] * len(resp)
        )  # the batch's sample is left as it came
        lp, _ = TorchTrainer("cpu").token_stats(policy, [x], 1.0, grad=False)
        self.assertTrue(torch.isfinite(lp).all())
        res = self.run_pair_step(s, "sampled-pad")
        self.assertEqual(res["num_tokens"], 2 * 2)
        self.assertTrue(np.isfinite(res["metrics"]["pg_loss"]))

    def test_packed_rows_are_refused_with_the_reason(self):
        from rlq_torch.trainer import StepError

        with self.assertRaises(StepError) as e:
            self.run_step(
                self.batch(),
                self.step_dir("packed"),
                use_dynamic_batch_size=True,
                max_tokens_per_gpu=4096,
            )
        self.assertIn("mrope", str(e.exception))


class TestTrainStepQwen25VL(TestTrainStep):
    """The same step on Qwen2.5-VL (windowed vision attention, its own processor class)."""

    ARCH = "qwen2_5_vl"


if __name__ == "__main__":
    unittest.main()
