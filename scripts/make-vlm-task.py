"""Write a synthetic visual task and a tiny vision-language model warmed on it: the vision-language run test uses them.

    .venv/bin/python scripts/make-vlm-task.py OUT_DIR [--seed 0] [--target 0.6] [--rows 64]

The task, "which square is larger": a 56x56 picture holds a red and a blue square on white, one in each half
(which half is drawn), their sides drawn from 6 to 26 px at least 4 px apart; the prompt is the user turn
"Which square is larger, red (r) or blue (b)?" with the picture, the answer "r" or "b" and the end of the
turn. What it writes, deterministically from the seed, downloading nothing:
- OUT_DIR/model: a tiny random Qwen2-VL (scripts/make-tiny-vlm.py) trained by plain supervised steps (AdamW,
  loss on the answer tokens only) on pictures of its own, stopped once its expected reward on another set of
  pictures reaches --target (checked every 10 steps): it answers in the right form and better than chance but
  far from always, so RL has room to raise the reward;
- OUT_DIR/data/train.jsonl: rows {"input", "label", "images"} for rlq (multimodal_keys {"image": "images"},
  rm_type exact_match; the label is the response as it decodes, the letter then <|im_end|>), pictures
  under OUT_DIR/data/img/, drawn from another seed than the warm-up's;
- on stdout, one JSON line: the warm model's expected reward on those rows at temperature 1 (the mean
  probability of the exact answer).

The SFT inputs are built by the model's own processor from the chat template, as rlq's rollout and trainer
build them (src/data/chat-template.ts, workers/trainer-torch/rlq_torch/vlm.py). A counting task ("how many
squares") was tried first: this model (width 32, one vision block) stays at chance on it through 1500 steps.
"""

import argparse
import importlib.util
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "workers", "trainer-torch"))

from rlq_torch.vlm import load_processor

SIZE = 56
RED, BLUE = (220, 30, 30), (30, 90, 220)
QUESTION = "Which square is larger, red (r) or blue (b)?"


def picture(rng: np.random.Generator) -> tuple[np.ndarray, str]:
    """[56, 56, 3] uint8 with a red and a blue square, one per half, and the answer: "r" or "b"."""
    while True:
        red, blue = (int(x) for x in rng.integers(6, 27, size=2))
        if abs(red - blue) >= 4:
            break
    img = np.full((SIZE, SIZE, 3), 255, dtype=np.uint8)
    red_half = int(rng.integers(2))
    for half, colour, side in ((red_half, RED, red), (1 - red_half, BLUE, blue)):
        x0 = half * SIZE // 2 + int(rng.integers(0, SIZE // 2 - side + 1))
        y0 = int(rng.integers(0, SIZE - side + 1))
        img[y0 : y0 + side, x0 : x0 + side] = colour
    return img, "r" if red > blue else "b"


def prompt_text(tok) -> str:
    # The user turn as rlq renders it with multimodal_keys: the text, then one part per image.
    parts = [{"type": "text", "text": QUESTION}, {"type": "image"}]
    return tok.apply_chat_template(
        [{"role": "user", "content": parts}], tokenize=False, add_generation_prompt=True
    )


def encode_rows(proc, prompt: str, answers: list[str], images):
    """Processor inputs of prompt + answer per row (answers of one token length), labels on the answers only."""
    full = proc(
        text=[prompt + a for a in answers],
        images=[_pil(i) for i in images],
        return_tensors="pt",
    )
    n_answer = len(proc.tokenizer.encode(answers[0], add_special_tokens=False))
    labels = full["input_ids"].clone()
    labels[:, :-n_answer] = -100
    return full, labels


def answer_of(letter: str) -> str:
    return f"{letter}<|im_end|>"


@torch.no_grad()
def expected_reward(model, proc, prompt: str, images, letters) -> float:
    """Mean probability of the exact answer (letter then <|im_end|>) at temperature 1: the expected exact_match reward."""
    full, labels = encode_rows(proc, prompt, [answer_of(x) for x in letters], images)
    logits = model(**full).logits[:, :-1]
    target = full["input_ids"][:, 1:]
    lp = torch.log_softmax(logits.float(), -1).gather(-1, target[..., None])[..., 0]
    lp = (lp * (labels[:, 1:] != -100)).sum(-1)
    return float(lp.exp().mean())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", type=float, default=0.6)
    ap.add_argument("--max-sft-steps", type=int, default=1000)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    spec = importlib.util.spec_from_file_location(
        "make_tiny_vlm", os.path.join(HERE, "make-tiny-vlm.py")
    )
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    model_dir = os.path.join(args.out, "model")
    sys.argv = ["make-tiny-vlm.py", model_dir, "--seed", str(args.seed)]
    make.main()

    from transformers import AutoModelForImageTextToText

    proc = load_processor(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    prompt = prompt_text(proc.tokenizer)

    rng = np.random.default_rng(args.seed)
    # The warm-up stops at the first check where the expected reward on pictures of its own reaches the
    # target: when the model starts to tell the squares apart depends on the seed (from about 100 steps to
    # several hundred), so a fixed step count leaves some seeds at chance, where RL has no signal to follow.
    check_rng = np.random.default_rng(args.seed + 2_000_003)
    check = [picture(check_rng) for _ in range(64)]
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    batch = 8
    steps = 0
    while steps < args.max_sft_steps:
        if steps % 10 == 0:
            model.eval()
            if (
                expected_reward(
                    model, proc, prompt, [x for x, _ in check], [y for _, y in check]
                )
                >= args.target
            ):
                break
            model.train()
        drawn = [picture(rng) for _ in range(batch)]
        # Every answer is one letter and <|im_end|>: the rows have one length, the labels are the last tokens.
        full, labels = encode_rows(
            proc, prompt, [answer_of(y) for _, y in drawn], [x for x, _ in drawn]
        )
        out = model(**full, labels=labels)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        steps += 1
    model.eval()
    model.save_pretrained(model_dir)

    data = os.path.join(args.out, "data")
    os.makedirs(os.path.join(data, "img"), exist_ok=True)
    rows_rng = np.random.default_rng(args.seed + 1_000_003)
    rows = [picture(rows_rng) for _ in range(args.rows)]
    with open(os.path.join(data, "train.jsonl"), "w") as f:
        for i, (img, letter) in enumerate(rows):
            path = f"img/{i}.png"
            _pil(img).save(os.path.join(data, path))
            f.write(
                json.dumps(
                    {"input": QUESTION, "label": answer_of(letter), "images": [path]}
                )
                + "\n"
            )
    reward = expected_reward(
        model, proc, prompt, [x for x, _ in rows], [y for _, y in rows]
    )
    print(
        json.dumps(
            {
                "expected_reward": round(reward, 4),
                "sft_steps": steps,
                "rows": args.rows,
            }
        )
    )


def _pil(a: np.ndarray):
    from PIL import Image

    return Image.fromarray(a)


if __name__ == "__main__":
    main()
