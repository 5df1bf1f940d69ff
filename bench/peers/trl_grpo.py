"""TRL's GRPOTrainer on the demo task: the peer side of bench/peers-trl.ts (bench/README.md, "Peers").

    .venv-peers/bin/python bench/peers/trl_grpo.py --model DIR --data examples/demo/train.jsonl --steps 30 --out FILE

The fixture model (scripts/build-fixture-model.py), the demo's prompts as one user turn under the model's chat
template, and a reward that is rlq's `rm_type: math` for these rows: 1 when the last \\boxed{...} of the answer
equals the label, else 0 (src/reward/boxed.ts; the labels are integers, so no normalisation applies). The
settings are rlq's run's, named in bench/README.md: group size, prompts per step, one optimizer step per batch,
learning rate, clip, AdamW betas, temperature, response length, no KL term, the per-sample mean loss.
Writes JSON: per-step mean reward with its monotonic time since the trainer started, and the CPU seconds of this
process and its children.
"""

import argparse
import json
import os
import resource
import time


def last_boxed(text: str):
    i = text.rfind("\\boxed{")
    if i < 0:
        return None
    depth, j = 0, i + len("\\boxed")
    for k in range(j, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return text[j + 1 : k]
    return None


def math_reward(completions, label, **_):
    out = []
    for c, want in zip(completions, label):
        text = c[0]["content"] if isinstance(c, list) else c
        got = last_boxed(text)
        out.append(1.0 if got is not None and got.strip() == str(want).strip() else 0.0)
    return out


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--prompts-per-step", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--max-response-len", type=int, default=12)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", required=True)
    a = p.parse_args()

    started = time.monotonic()
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = [json.loads(line) for line in open(a.data) if line.strip()]
    data = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": r["input"]}], "label": r["label"]}
            for r in rows
        ]
    )
    samples = a.prompts_per_step * a.group
    steps = []

    class Record(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                steps.append(
                    {
                        "step": state.global_step,
                        "reward": logs["reward"],
                        "t": time.monotonic() - t0,
                        "cpu_s": cpu_seconds(),
                    }
                )

    config = GRPOConfig(
        output_dir=os.path.join(os.path.dirname(a.out) or ".", "trl-out"),
        max_steps=a.steps,
        learning_rate=a.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        max_grad_norm=1.0,
        num_generations=a.group,
        generation_batch_size=samples,
        per_device_train_batch_size=samples,
        gradient_accumulation_steps=1,
        num_iterations=1,
        max_completion_length=a.max_response_len,
        temperature=1.0,
        top_p=1.0,
        beta=0.0,
        epsilon=0.2,
        loss_type="grpo",
        scale_rewards="group",
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=a.seed,
        use_cpu=True,
        bf16=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    # The fixture model's config.json names no architecture, which TRL's loader by path requires: load it here.
    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=[math_reward],
        args=config,
        train_dataset=data,
        callbacks=[Record()],
    )
    loaded = time.monotonic() - started
    t0 = time.monotonic()
    trainer.train()
    wall = time.monotonic() - t0
    result = {
        "side": "trl",
        "load_s": loaded,
        "train_wall_s": wall,
        "cpu_s": cpu_seconds(),
        "samples": samples * len(steps),
        "steps": steps,
        "torch_threads": __import__("torch").get_num_threads(),
    }
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "steps"}))


if __name__ == "__main__":
    main()
