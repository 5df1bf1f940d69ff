"""A reward model: the trainer's value model (critic.py) trained with a Bradley-Terry loss on preference pairs.

The model is the PPO critic's: a Hugging Face policy's base model (its decoder and final norm, no LM head) plus a
linear value head ``[d, 1]`` initialised to zero. A sequence's reward is the head's value at its last real token
(right padding), as OpenRLHF's RewardModel (openrlhf/models/model.py, the value at the eos index) and TRL's reward
trainer (a sequence-classification head read at the last non-pad token) read it.

The loss is Bradley-Terry: ``-log sigmoid(r_chosen - r_rejected)``, averaged over pairs (OpenRLHF
openrlhf/models/loss.py PairWiseLoss; TRL trl/trainer/reward_trainer.py, without its optional margin). Accuracy is
the share of pairs with ``r_chosen > r_rejected`` (OpenRLHF train_rm's ``acc``, TRL's ``accuracy``).

A pair row (JSONL): ``{"prompt": str, "chosen": str, "rejected": str}``. The scored text is ``prompt + response``,
tokenised without special tokens (the prompt is already chat-rendered, as rlq's rollout renders it), cut to the
first ``max_length`` tokens (OpenRLHF's RewardDataset truncates on the right too).

Saved as the critic is (``critic/weights.safetensors``, format ``rlq-hf-critic-v1``), so ``critic.load_critic``
reads it back; ``export_onnx`` writes the model directory that rlq's ``rm_type: onnx_rm`` reads
(src/reward/onnx-rm.ts): ``model.onnx``, the tokenizer files and ``reward_model.json``.
"""

from __future__ import annotations

import json
import os
import shutil

import torch
import torch.nn.functional as F
from torch import nn

from .critic import Critic

ONNX_FORMAT = "rlq-onnx-rm-v1"
MANIFEST = "reward_model.json"
ONNX_FILE = "model.onnx"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


class RewardModelError(Exception):
    pass


def read_pairs(path: str) -> list[dict[str, str]]:
    """The pairs of a JSONL file; a row without string prompt/chosen/rejected is an error naming the line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            bad = [
                k
                for k in ("prompt", "chosen", "rejected")
                if not isinstance(row.get(k), str)
            ]
            if bad:
                raise RewardModelError(
                    f"{path}:{n}: the row needs string fields {bad}; "
                    'write {"prompt": "...", "chosen": "...", "rejected": "..."}'
                )
            out.append(row)
    return out


def encode_texts(tokenizer, texts: list[str], max_length: int, pad_id: int):
    """[B, T] int64 ids right-padded with ``pad_id``, and [B, T] int64 attention mask; T = the longest, <= max_length."""
    rows = [tokenizer.encode(t, add_special_tokens=False)[:max_length] for t in texts]
    if any(len(r) == 0 for r in rows):
        raise RewardModelError(
            "a text tokenises to no tokens: there is nothing to score"
        )
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(rows), width), dtype=torch.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.int64)
        mask[i, : len(r)] = 1
    return ids, mask


class ScoreNet(nn.Module):
    """(input_ids [B, T] int64, attention_mask [B, T] int64) -> scores [B] float32: the value at the last real token.

    The trunk is causal and the padding is on the right, so a real token never attends to a pad: the trunk needs no
    mask, and the exported graph is the one that training ran.
    """

    def __init__(self, critic: Critic):
        super().__init__()
        self.trunk = critic.module
        self.head_w = critic.head_w
        self.head_b = critic.head_b

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        h = self.trunk(
            input_ids=input_ids, use_cache=False
        ).last_hidden_state  # [B, T, d]
        last = (attention_mask.sum(dim=1) - 1).clamp(min=0)  # [B]
        idx = last.view(-1, 1, 1).expand(-1, 1, h.shape[-1])  # [B, 1, d]
        h_last = torch.gather(h, 1, idx)[:, 0, :]  # [B, d]
        return (h_last @ self.head_w)[:, 0] + self.head_b[0]  # [B]


def bradley_terry_loss(
    r_chosen: torch.Tensor, r_rejected: torch.Tensor
) -> torch.Tensor:
    """mean over pairs of -log sigmoid(r_chosen - r_rejected)."""
    return -F.logsigmoid(r_chosen - r_rejected).mean()


def critic_from_hf_dir(model_dir: str) -> Critic:
    """A value model whose trunk starts at the HF model's weights, its head at zero (critic.Critic.from_policy)."""
    from .models import load_hf_dir

    policy = load_hf_dir(model_dir, torch.device("cpu"))
    return Critic.from_policy(policy, torch.device("cpu"))


def pair_scores(net: ScoreNet, tokenizer, pairs, max_length: int, pad_id: int):
    """(r_chosen [B], r_rejected [B]) in one forward over the 2B texts."""
    texts = [p["prompt"] + p["chosen"] for p in pairs] + [
        p["prompt"] + p["rejected"] for p in pairs
    ]
    ids, mask = encode_texts(tokenizer, texts, max_length, pad_id)
    r = net(ids, mask)
    return r[: len(pairs)], r[len(pairs) :]


@torch.no_grad()
def evaluate(
    net: ScoreNet, tokenizer, pairs, max_length: int, pad_id: int, batch: int = 64
) -> dict:
    net.eval()
    correct, loss_sum = 0, 0.0
    for i in range(0, len(pairs), batch):
        rc, rr = pair_scores(net, tokenizer, pairs[i : i + batch], max_length, pad_id)
        correct += int((rc > rr).sum())
        loss_sum += float(bradley_terry_loss(rc, rr)) * len(rc)
    net.train()
    return {
        "accuracy": correct / len(pairs),
        "loss": loss_sum / len(pairs),
        "pairs": len(pairs),
    }


def export_onnx(
    net: ScoreNet, tokenizer_dir: str, out_dir: str, max_length: int, pad_id: int
) -> str:
    """Write ``out_dir/model.onnx`` (torch.onnx.export), the tokenizer files and ``reward_model.json``."""
    os.makedirs(out_dir, exist_ok=True)
    net.eval()
    ids = torch.full((2, 8), pad_id, dtype=torch.int64)
    ids[:, :5] = 1
    mask = (ids != pad_id).to(torch.int64)
    batch = torch.export.Dim("batch", min=1, max=4096)
    seq = torch.export.Dim("seq", min=2, max=max(max_length, 3))
    path = os.path.join(out_dir, ONNX_FILE)
    torch.onnx.export(
        net,
        (ids, mask),
        path,
        input_names=["input_ids", "attention_mask"],
        output_names=["scores"],
        dynamic_shapes={
            "input_ids": {0: batch, 1: seq},
            "attention_mask": {0: batch, 1: seq},
        },
        dynamo=True,
        external_data=False,
    )
    if not os.path.exists(os.path.join(tokenizer_dir, "tokenizer.json")):
        raise RewardModelError(
            f"{tokenizer_dir}: no tokenizer.json to write beside the ONNX model"
        )
    for name in TOKENIZER_FILES:
        src = os.path.join(tokenizer_dir, name)
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(out_dir, name))
    manifest = {
        "format": ONNX_FORMAT,
        "model": ONNX_FILE,
        "max_length": int(max_length),
        "pad_token_id": int(pad_id),
        "inputs": ["input_ids", "attention_mask"],
        "output": "scores",
    }
    with open(os.path.join(out_dir, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=2)
    return path
