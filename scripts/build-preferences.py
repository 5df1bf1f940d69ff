"""Synthetic preference pairs from the demo task: the correct answer chosen over an incorrect one.

    .venv/bin/python scripts/build-preferences.py --out DIR [--format chat|raw|both] [--seed 1]

Writes DIR/train.jsonl (from examples/demo/train.jsonl) and DIR/eval.jsonl (from examples/demo/eval.jsonl, the
held-out prompts), one row per prompt: {"prompt", "chosen", "rejected"}. The chosen response is the demo's answer
format, `\\boxed{N}` with N the label (what rm_type math grades correct); the rejected one is, by a seeded draw,
- a near miss (--near-miss, 40%): N off by 1, 2 or 10, or two digits swapped, so the model must read the sum and
  not the form;
- a malformed answer (--malformed, 30%): the right number without a box, an unclosed box, an empty box, or nothing,
  the kinds of failure a sampling policy makes;
- another number (the rest): a uniform draw of the same size.
Each row's "kind" names which, so accuracy can be read per kind.

`--policy-samples DIR` (scripts/sample-demo-policy.ts's output) adds hard negatives from the policy's own samples:
for each prompt, up to --policy-per-prompt of the distinct wrong answers the policy gave, each rejected against the
right one (kind "policy"). Such a pair differs only in correctness, in the policy's own form and its own slips (a
carry lost, a digit off by one), which is what a GRPO run rewarded by the model asks it to rank.

`--format chat` renders the prompt with the fixture model's ChatML template (scripts/build-fixture-model.py) and
ends the responses with `<|im_end|>`, as the real stack's rollouts read; `raw` keeps the demo's bare `13+81=` and
bare responses, as the embedded demo's rollouts read; `both` (the default) draws one of the two per row.
"""

import argparse
import json
import os
import random

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def chat_prompt(text: str) -> str:
    return "<|im_start|>user\n" + text + "<|im_end|>\n<|im_start|>assistant\n"


def wrong_number(label: int, rng: random.Random, near_share: float) -> int:
    while True:
        kind = rng.random()
        if kind < near_share:
            d = str(label)
            if len(d) >= 2 and rng.random() < 0.25:
                i = rng.randrange(len(d) - 1)
                n = int(d[:i] + d[i + 1] + d[i] + d[i + 2 :])
            else:
                n = label + rng.choice([-10, -2, -1, 1, 2, 10])
        else:
            n = rng.randrange(0, 10 ** len(str(label)))
        if n != label and n >= 0:
            return n


def rejected_response(
    label: int, rng: random.Random, near_miss: float, malformed: float
) -> tuple[str, str]:
    """(the rejected response, its kind: near_miss, other_number or malformed)."""
    u = rng.random()
    if u < near_miss:
        return "\\boxed{" + str(wrong_number(label, rng, 1.0)) + "}", "near_miss"
    if u < 1.0 - malformed:
        return "\\boxed{" + str(wrong_number(label, rng, 0.0)) + "}", "other_number"
    return rng.choice(
        [str(label), "\\boxed{" + str(label), "\\boxed{}", ""]
    ), "malformed"


def pair(prompt: str, chosen: str, rejected: str, kind: str, use_chat: bool) -> dict:
    if use_chat:
        return {
            "prompt": chat_prompt(prompt),
            "chosen": chosen + "<|im_end|>",
            "rejected": rejected + "<|im_end|>",
            "kind": kind,
        }
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected, "kind": kind}


def policy_wrong_answers(path: str) -> dict[str, list[str]]:
    """prompt -> the distinct wrong responses the policy gave it, in the order first seen."""
    wrong: dict[str, list[str]] = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if not isinstance(row.get("input"), str) or not isinstance(
                row.get("response"), str
            ):
                raise SystemExit(
                    f"{path}:{n}: a policy sample needs string input and response "
                    "(scripts/sample-demo-policy.ts writes them)"
                )
            seen = wrong.setdefault(row["input"], [])
            if not row.get("correct") and row["response"] not in seen:
                seen.append(row["response"])
    return wrong


def build(
    rows,
    fmt: str,
    rng: random.Random,
    near_miss: float,
    malformed: float,
    policy_wrong: dict[str, list[str]] | None = None,
    policy_per_prompt: int = 0,
):
    out = []
    for r in rows:
        label = int(r["label"])
        chosen = "\\boxed{" + str(label) + "}"
        rejected, kind = rejected_response(label, rng, near_miss, malformed)
        use_chat = fmt == "chat" or (fmt == "both" and rng.random() < 0.5)
        out.append(pair(r["input"], chosen, rejected, kind, use_chat))
        for bad in (policy_wrong or {}).get(r["input"], [])[:policy_per_prompt]:
            out.append(pair(r["input"], chosen, bad, "policy", use_chat))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--out", required=True, help="directory for train.jsonl and eval.jsonl"
    )
    ap.add_argument("--format", choices=["chat", "raw", "both"], default="both")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--near-miss", type=float, default=0.4, help="share of near-miss rejections"
    )
    ap.add_argument(
        "--malformed",
        type=float,
        default=0.3,
        help="share of malformed rejections (the rest: other numbers)",
    )
    ap.add_argument(
        "--policy-samples",
        default=None,
        help="directory of scripts/sample-demo-policy.ts output: its wrong answers become rejected responses",
    )
    ap.add_argument(
        "--policy-per-prompt",
        type=int,
        default=4,
        help="at most this many of the policy's distinct wrong answers per prompt",
    )
    args = ap.parse_args()
    rng = random.Random(args.seed)
    os.makedirs(args.out, exist_ok=True)
    for split in ("train", "eval"):
        with open(os.path.join(ROOT, "examples", "demo", f"{split}.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        policy_wrong = (
            policy_wrong_answers(os.path.join(args.policy_samples, f"{split}.jsonl"))
            if args.policy_samples
            else None
        )
        pairs = build(
            rows,
            args.format,
            rng,
            args.near_miss,
            args.malformed,
            policy_wrong,
            args.policy_per_prompt,
        )
        with open(os.path.join(args.out, f"{split}.jsonl"), "w") as f:
            for p in pairs:
                f.write(json.dumps(p) + "\n")
        print(
            f"{split}: {len(pairs)} pairs -> {os.path.join(args.out, split + '.jsonl')}"
        )


if __name__ == "__main__":
    main()
