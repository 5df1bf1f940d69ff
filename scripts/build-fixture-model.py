"""Build rlq's small real model: a Hugging Face Qwen2 model that has learned half of the demo task.

    .venv/bin/python scripts/build-fixture-model.py          # prints the model directory

What it makes, deterministically from a seed, and never downloads:
- a byte-level BPE tokenizer trained by `tokenizers` on the demo's task text (examples/demo/*.jsonl),
  digits split one per token as Qwen2's own pre-tokenizer does, with a ChatML chat template
  (`<|im_start|>user ... <|im_end|>`) and `<|im_end|>` as end of turn;
- a Qwen2-architecture causal LM (3 layers, width 64, two heads of dimension 32, the smallest head
  vLLM's CPU attention supports; output layer untied from the embedding), initialised from the seed;
- a supervised warm start: the chat-formatted prompt `13+81=` answered `\\boxed{94}<|im_end|>` (the
  demo's answer format, graded by rm_type math), trained with
  rlq's PyTorch trainer model code (rlq_torch.models.HFPolicy) and AdamW until the expected accuracy
  of sampling at temperature 1 (the mean over the eval split of P(answer and end of turn), computed
  exactly from log-probs) reaches --target, about where the embedded demo starts (~0.49);
- saved by the trainer's own HF save path (weights.safetensors and its index, config.json), beside
  the tokenizer files and generation_config.json; build-info.json records what this run did.

It lands in a cache directory keyed by this file's content ($RLQ_FIXTURE_CACHE, default
~/.cache/rlq/fixture-model/<key>), reused when present: a change to this script builds a new one.
"""

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "workers", "trainer-torch"))

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MODEL = dict(
    model_type="qwen2",
    hidden_size=64,
    intermediate_size=256,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=128,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    # Untied: vLLM 0.32's in-place reload leaves a tied output layer at its old weights
    # (src/engines/openai-compat.ts refuseTiedReload), and the tests load every trained version into vLLM.
    tie_word_embeddings=False,
)


def cache_dir() -> str:
    with open(os.path.abspath(__file__), "rb") as f:
        key = hashlib.sha256(f.read()).hexdigest()[:16]
    base = os.environ.get("RLQ_FIXTURE_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "rlq", "fixture-model"
    )
    return os.path.join(base, key)


def read_rows(name: str):
    with open(os.path.join(ROOT, "examples", "demo", name)) as f:
        return [json.loads(line) for line in f if line.strip()]


def build_tokenizer(rows, out_dir: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [
        f"<|im_start|>user\n{r['input']}<|im_end|>\n<|im_start|>assistant\n{answer_text(r['label'])}<|im_end|>\n"
        for r in rows
    ]
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def answer_text(label: str) -> str:
    """The demo task's answer format (examples/demo/task.ts formatAnswer), which rm_type math grades."""
    return "\\boxed{" + label + "}"


def encode_rows(tok, rows):
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    out = []
    for r in rows:
        # rendered, then encoded without special tokens: what rlq's rollout side does (src/engines/hf-tokenizer.ts)
        text = tok.apply_chat_template(
            [{"role": "user", "content": r["input"]}],
            add_generation_prompt=True,
            tokenize=False,
        )
        prompt = tok.encode(text, add_special_tokens=False)
        answer = tok.encode(answer_text(r["label"]), add_special_tokens=False) + [eos]
        out.append((list(prompt), answer))
    return out


def batch_tensors(torch, pairs, pad_id: int):
    width = max(len(p) + len(a) for p, a in pairs)
    ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    target = torch.full((len(pairs), width), -100, dtype=torch.long)
    for i, (p, a) in enumerate(pairs):
        seq = p + a
        ids[i, : len(seq)] = torch.tensor(seq)
        # position t predicts token t+1: the answer tokens are the targets of the positions before them
        target[i, len(p) - 1 : len(seq) - 1] = torch.tensor(a)
    return ids, target


def answer_logprobs(torch, policy, pairs, pad_id: int):
    """log P(answer and end of turn | prompt) per pair, at temperature 1."""
    ids, target = batch_tensors(torch, pairs, pad_id)
    logits = policy.logits(policy.hidden_states(ids))
    lp = torch.log_softmax(logits.double(), dim=-1)
    mask = target != -100
    picked = lp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (picked * mask).sum(-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--target",
        type=float,
        default=0.5,
        help="stop when the expected accuracy at temperature 1 reaches this",
    )
    ap.add_argument("--seed", type=int, default=20261126)
    ap.add_argument("--max-steps", type=int, default=4000)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument(
        "--out",
        default=None,
        help="build here instead of the cache directory (always rebuilds)",
    )
    args = ap.parse_args()

    out = args.out or cache_dir()
    if args.out is None and os.path.isfile(os.path.join(out, "build-info.json")):
        print(out)
        return

    import torch
    from rlq_torch.models import hf_from_config
    from transformers import AutoConfig

    torch.set_num_threads(
        1
    )  # OpenMP threads spin and crawl on a busy 2-core machine; one is steady
    started = time.time()
    train_rows, eval_rows = read_rows("train.jsonl"), read_rows("eval.jsonl")
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".building-", dir=parent)
    try:
        tok = build_tokenizer(train_rows + eval_rows, work)
        pad_id = tok.convert_tokens_to_ids("<|endoftext|>")
        eos_id = tok.convert_tokens_to_ids("<|im_end|>")
        config = dict(
            MODEL,
            vocab_size=len(tok),
            bos_token_id=eos_id,
            eos_token_id=eos_id,
            pad_token_id=pad_id,
        )
        policy = hf_from_config(config, torch.device("cpu"), args.seed)
        train, evals = encode_rows(tok, train_rows), encode_rows(tok, eval_rows)
        opt = torch.optim.AdamW(
            [p for _, p in policy.named_params()],
            lr=args.lr,
            betas=(0.9, 0.99),
            weight_decay=0.01,
        )
        rng = random.Random(args.seed)
        batch, step, accuracy, history, loss = 128, 0, 0.0, [], None
        while step < args.max_steps:
            if step % 10 == 0:
                with torch.no_grad():
                    policy.module.eval()
                    accuracy = float(
                        answer_logprobs(torch, policy, evals, pad_id).exp().mean()
                    )
                    policy.module.train()
                history.append({"step": step, "expected_accuracy": round(accuracy, 4)})
                print(
                    f"step {step}: expected accuracy {accuracy:.3f} loss {float(loss) if loss is not None else float('nan'):.4f}",
                    file=sys.stderr,
                )
                if accuracy >= args.target:
                    break
            ids, target = batch_tensors(torch, rng.sample(train, batch), pad_id)
            logits = policy.logits(policy.hidden_states(ids))
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]),
                target.reshape(-1),
                ignore_index=-100,
            )
            for g in opt.param_groups:
                g["lr"] = args.lr * min(1.0, (step + 1) / 100)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for _, p in policy.named_params()], 1.0)
            opt.step()
            step += 1
        if accuracy < args.target:
            raise SystemExit(
                f"build-fixture-model: expected accuracy {accuracy:.3f} after {step} steps, short of --target {args.target}"
            )
        policy.module.config.torch_dtype = "float32"
        policy.save(work, 0, "fixture-model", step)
        with open(os.path.join(work, "generation_config.json"), "w") as f:
            json.dump(
                {
                    "bos_token_id": eos_id,
                    "eos_token_id": eos_id,
                    "pad_token_id": pad_id,
                },
                f,
                indent=2,
            )
        AutoConfig.from_pretrained(
            work, local_files_only=True
        )  # the directory reads back as a HF model
        info = {
            "architecture": "Qwen2ForCausalLM",
            "parameters": sum(p.numel() for _, p in policy.named_params()),
            "vocab_size": len(tok),
            "seed": args.seed,
            "sft_steps": step,
            "expected_accuracy": round(accuracy, 4),
            "target": args.target,
            "history": history,
            "seconds": round(time.time() - started, 1),
            "torch": torch.__version__,
        }
        with open(os.path.join(work, "build-info.json"), "w") as f:
            json.dump(info, f, indent=2)
        if os.path.isdir(out):
            shutil.rmtree(out)
        os.replace(work, out)
    finally:
        if os.path.isdir(work):
            shutil.rmtree(work, ignore_errors=True)
    print(
        f"build-fixture-model: {info['parameters']} parameters, expected accuracy {accuracy:.3f} after {step} steps, {info['seconds']} s",
        file=sys.stderr,
    )
    print(out)


if __name__ == "__main__":
    main()
