"""Train a reward model (Bradley-Terry on a value head) on preference pairs, report held-out accuracy, export ONNX.

    .venv/bin/python scripts/build-preferences.py --out /tmp/prefs
    .venv/bin/python scripts/train-reward-model.py --pairs /tmp/prefs --out /tmp/rm \\
        [--model-dir DIR] [--steps 600] [--batch 32] [--lr 3e-4] [--max-length 64] [--results bench/results/reward-model.json]

The model is the torch trainer's value model (rlq_torch/critic.py: the HF model's base model plus a value head),
started from --model-dir (default: the fixture model, scripts/build-fixture-model.py), trained with AdamW on
rlq_torch/reward_model.py's Bradley-Terry loss over DIR/train.jsonl; accuracy and loss on DIR/eval.jsonl are measured
before training and every --eval-every steps. Writes OUT/critic/weights.safetensors (critic.load_critic reads it) and
OUT/onnx/ (model.onnx, the tokenizer files, reward_model.json: what `rm_type: onnx_rm` reads via rm_model_path), and
prints (and writes to --results) a JSON summary.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "workers", "trainer-torch"))


def fixture_model_dir() -> str:
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "build-fixture-model.py")],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1]


def main() -> None:
    import torch
    from rlq_torch import reward_model as rm
    from transformers import AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--pairs", required=True, help="directory with train.jsonl and eval.jsonl"
    )
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--model-dir",
        default=None,
        help="HF model directory to start from (default: the fixture model)",
    )
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=32, help="pairs per step")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--results", default=None, help="also write the JSON summary here")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    model_dir = args.model_dir or fixture_model_dir()
    tok = AutoTokenizer.from_pretrained(model_dir)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    train = rm.read_pairs(os.path.join(args.pairs, "train.jsonl"))
    held_out = rm.read_pairs(os.path.join(args.pairs, "eval.jsonl"))

    critic = rm.critic_from_hf_dir(model_dir)
    net = rm.ScoreNet(critic)
    opt = torch.optim.AdamW(
        [p for _, p in critic.named_params()], lr=args.lr, weight_decay=0.0
    )
    history = [{"step": 0, **rm.evaluate(net, tok, held_out, args.max_length, pad)}]
    print(json.dumps(history[-1]), flush=True)
    t0 = time.time()
    order: list[int] = []
    for step in range(1, args.steps + 1):
        if len(order) < args.batch:
            order = list(range(len(train)))
            rng.shuffle(order)
        batch = [train[order.pop()] for _ in range(args.batch)]
        rc, rr = rm.pair_scores(net, tok, batch, args.max_length, pad)
        loss = rm.bradley_terry_loss(rc, rr)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % args.eval_every == 0 or step == args.steps:
            history.append(
                {
                    "step": step,
                    "train_loss": float(loss),
                    **rm.evaluate(net, tok, held_out, args.max_length, pad),
                }
            )
            print(json.dumps(history[-1]), flush=True)
    train_s = time.time() - t0

    # Accuracy per kind of rejected answer (scripts/build-preferences.py "kind"): a model that learned only the answer's
    # form scores near misses at chance.
    kinds = sorted({p.get("kind", "") for p in held_out} - {""})
    by_kind = {
        k: rm.evaluate(
            net, tok, [p for p in held_out if p.get("kind") == k], args.max_length, pad
        )
        for k in kinds
    }
    critic.save_weights(args.out, 0, "reward-model", args.steps)
    onnx_dir = os.path.join(args.out, "onnx")
    rm.export_onnx(net, model_dir, onnx_dir, args.max_length, pad)
    summary = {
        "what": "Bradley-Terry reward model on the demo task's synthetic preferences (scripts/build-preferences.py)",
        "command": " ".join(["scripts/train-reward-model.py"] + sys.argv[1:]),
        "model": os.path.basename(model_dir.rstrip("/")),
        "train_pairs": len(train),
        "held_out_pairs": len(held_out),
        "steps": args.steps,
        "batch_pairs": args.batch,
        "lr": args.lr,
        "max_length": args.max_length,
        "train_seconds": round(train_s, 1),
        "held_out_accuracy_before": history[0]["accuracy"],
        "held_out_accuracy": history[-1]["accuracy"],
        "held_out_loss": history[-1]["loss"],
        "held_out_accuracy_by_kind": {k: v["accuracy"] for k, v in by_kind.items()},
        "history": history,
        "onnx_dir": onnx_dir,
    }
    print(json.dumps(summary, indent=2))
    if args.results:
        with open(args.results, "w") as f:
            json.dump(summary, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
