"""Export a reward model to ONNX (torch.onnx.export) as the model directory `rm_type: onnx_rm` reads.

    .venv/bin/python scripts/export-reward-model.py --checkpoint OUT --tokenizer-dir DIR --out MODEL_DIR [--max-length 64]
    .venv/bin/python scripts/export-reward-model.py --tiny --tokenizer-dir DIR --out MODEL_DIR [--texts F --scores-out S]

--checkpoint: a directory holding critic/weights.safetensors (what scripts/train-reward-model.py writes as OUT; the
PPO critic's own checkpoint works too). --tiny: a small random Qwen2 reward model (width 32, 2 layers, a random value
head) over the tokenizer's vocabulary, for tests of the export. The tokenizer files come from --tokenizer-dir.

--texts F (a JSON list of strings) with --scores-out S writes {"texts", "scores"}: torch's scores of those texts
(rlq_torch/reward_model.py ScoreNet, the same ids and truncation as the ONNX reader), to compare against onnxruntime.
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "workers", "trainer-torch"))


def tiny_critic(vocab_size: int, seed: int):
    import torch
    from rlq_torch.critic import Critic
    from transformers import Qwen2Config

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    from transformers import AutoModel

    trunk = {
        n: p.detach().clone()
        for n, p in AutoModel.from_config(cfg, dtype=torch.float32).named_parameters()
    }
    return Critic.hf(
        cfg, trunk, torch.randn(32, 1) * 0.5, torch.randn(1), torch.device("cpu")
    )


def main() -> None:
    import torch
    from rlq_torch import reward_model as rm
    from rlq_torch.critic import load_critic
    from transformers import AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="directory with critic/weights.safetensors")
    src.add_argument(
        "--tiny", action="store_true", help="a small random reward model (tests)"
    )
    ap.add_argument(
        "--tokenizer-dir", required=True, help="HF directory with tokenizer.json"
    )
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--texts", default=None)
    ap.add_argument("--scores-out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)

    tok = AutoTokenizer.from_pretrained(args.tokenizer_dir)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    if args.tiny:
        critic = tiny_critic(len(tok), args.seed)
    else:
        loaded = load_critic(args.checkpoint, torch.device("cpu"))
        if loaded is None:
            sys.exit(
                f"{args.checkpoint}: no critic/weights.safetensors; pass the --out of scripts/train-reward-model.py"
            )
        critic = loaded[0]
    net = rm.ScoreNet(critic)
    net.eval()
    path = rm.export_onnx(net, args.tokenizer_dir, args.out, args.max_length, pad)
    print(path)
    if args.texts:
        with open(args.texts) as f:
            texts = json.load(f)
        with torch.no_grad():
            ids, mask = rm.encode_texts(tok, texts, args.max_length, pad)
            scores = net(ids, mask).tolist()
        with open(args.scores_out, "w") as f:
            json.dump(
                {"texts": texts, "scores": scores, "max_length": args.max_length}, f
            )


if __name__ == "__main__":
    main()
