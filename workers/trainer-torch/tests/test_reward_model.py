"""The reward model (rlq_torch/reward_model.py): the Bradley-Terry loss, the score read at the last real token
whatever the batch's padding, a learning step that separates a pair, and clear errors for bad preference rows."""

import json
import os
import tempfile
import unittest

from helpers import require

require("torch")
require("transformers")

import torch  # noqa: E402
from rlq_torch import reward_model as rm  # noqa: E402
from rlq_torch.critic import Critic  # noqa: E402
from transformers import Qwen2Config  # noqa: E402


class ByteTokenizer:
    """encode(text, add_special_tokens) as HF tokenizers do, one id per byte (ids 1..256; 0 pads)."""

    def encode(self, text, add_special_tokens=False):
        return [b + 1 for b in text.encode()]


def tiny_net(seed=3):
    torch.manual_seed(seed)
    from transformers import AutoModel

    cfg = Qwen2Config(
        vocab_size=257,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    trunk = {
        n: p.detach().clone() for n, p in AutoModel.from_config(cfg).named_parameters()
    }
    critic = Critic.hf(
        cfg, trunk, torch.randn(32, 1), torch.randn(1), torch.device("cpu")
    )
    return critic, rm.ScoreNet(critic)


class BradleyTerry(unittest.TestCase):
    def test_loss_is_the_mean_negative_log_sigmoid_of_the_margin(self):
        rc, rr = torch.tensor([2.0, 0.0, -1.0]), torch.tensor([1.0, 0.0, 1.0])
        # -log sigmoid(m) = log(1 + e^-m), by hand for m = 1, 0, -2
        expected = (0.31326168751822286 + 0.6931471805599453 + 2.1269280110429727) / 3
        self.assertAlmostEqual(float(rm.bradley_terry_loss(rc, rr)), expected, places=6)

    def test_a_score_is_the_value_at_the_last_real_token_whatever_the_padding(self):
        _, net = tiny_net()
        net.eval()
        tok = ByteTokenizer()
        texts = ["13+81=\\boxed{94}", "7", "99+99=\\boxed{198}"]
        with torch.no_grad():
            ids, mask = rm.encode_texts(tok, texts, 64, 0)
            together = net(ids, mask)
            alone = [float(net(*rm.encode_texts(tok, [t], 64, 0))[0]) for t in texts]
        for a, b in zip(together.tolist(), alone):
            self.assertAlmostEqual(a, b, places=5)
        # Truncation keeps the first max_length tokens: a text and its prefix of that length score alike.
        with torch.no_grad():
            cut = float(net(*rm.encode_texts(tok, ["13+81=\\boxed{94}"], 6, 0))[0])
            prefix = float(net(*rm.encode_texts(tok, ["13+81="], 64, 0))[0])
        self.assertAlmostEqual(cut, prefix, places=5)

    def test_training_steps_rank_the_chosen_answer_first(self):
        critic, net = tiny_net()
        tok = ByteTokenizer()
        pairs = [{"prompt": "2+2=", "chosen": "\\boxed{4}", "rejected": "\\boxed{5}"}]
        opt = torch.optim.AdamW([p for _, p in critic.named_params()], lr=1e-2)
        losses = []
        for _ in range(20):
            rc, rr = rm.pair_scores(net, tok, pairs, 64, 0)
            loss = rm.bradley_terry_loss(rc, rr)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
        self.assertLess(losses[-1], losses[0])
        self.assertEqual(rm.evaluate(net, tok, pairs, 64, 0)["accuracy"], 1.0)

    def test_a_row_without_the_three_strings_is_refused_with_its_line(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "p.jsonl")
            with open(path, "w") as f:
                f.write(
                    json.dumps({"prompt": "a", "chosen": "b", "rejected": "c"}) + "\n"
                )
                f.write(json.dumps({"prompt": "a", "chosen": "b"}) + "\n")
            with self.assertRaisesRegex(
                rm.RewardModelError, r"p\.jsonl:2: .*\['rejected'\]"
            ):
                rm.read_pairs(path)


if __name__ == "__main__":
    unittest.main()
