/**
 * `node --import tsx scripts/lora-demo.ts [--out FILE] [--set key=value ...]`: the demo task on the real stack
 * (scripts/demo-vllm.ts: vLLM on the CPU, the PyTorch trainer on two FSDP2 ranks) with LoRA (lora_rank 8 through
 * peft, workers/trainer-torch/rlq_torch/lora.py). vLLM loads the merged weights at every version (weight_sync: disk).
 * Writes the per-step reward and train/rollout log-prob difference, and the reward before/after, as JSON
 * (default bench/results/lora-demo.json). `--full-ft` runs the same without LoRA, as a baseline.
 */
import { spawn } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { parseArgs } from "node:util";
import { repoRoot } from "./real-stack.ts";

const { values } = parseArgs({
  options: {
    out: { type: "string", default: join(repoRoot, "bench/results/lora-demo.json") },
    set: { type: "string", multiple: true },
    "full-ft": { type: "boolean", default: false },
  },
});
// --full-ft: the same run without LoRA (examples/vllm-demo.yaml's lr), the baseline the LoRA run is compared with.
const lora = values["full-ft"] === true ? [] : ["lora_rank=8", "lora_alpha=16", "lr=1.0e-3"];
const sets = ["num_rollout=20", ...lora, ...(values.set ?? [])];
const child = spawn(
  process.execPath,
  ["--max-semi-space-size=64", "--import", "tsx", join(repoRoot, "scripts/demo-vllm.ts"), ...sets.flatMap((s) => ["--set", s])],
  {
    cwd: repoRoot,
    stdio: ["ignore", "pipe", "inherit"],
  },
);
let out = "";
child.stdout.on("data", (d: Buffer) => {
  out += d.toString();
  process.stdout.write(d);
});
const code = await new Promise<number>((resolve) => child.once("exit", (c) => resolve(c ?? 1)));
// demo.ts's table: "step  reward  logprob|train-rollout|  seconds"
const steps = [...out.matchAll(/^\s*(\d+)\s+(-?[\d.]+)\s+(\S+)\s+([\d.]+)$/gm)].map((m) => ({
  step: Number(m[1]),
  reward: Number(m[2]),
  train_rollout_logprob_abs_diff: m[3] === "-" ? null : Number(m[3]),
  seconds: Number(m[4]),
}));
if (code !== 0 || steps.length < 6) {
  process.stderr.write(`lora-demo: the run failed (exit ${code}, ${steps.length} steps)\n`);
  process.exit(code || 1);
}
const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
const before = mean(steps.slice(0, 3).map((s) => s.reward));
const after = mean(steps.slice(-3).map((s) => s.reward));
const diffs = steps.map((s) => s.train_rollout_logprob_abs_diff).filter((d): d is number => d !== null);
const result = {
  what:
    lora.length > 0
      ? "the demo task (examples/vllm-demo.yaml) on vLLM CPU + the torch trainer (2 FSDP2 ranks) with LoRA; engines load the merged weights"
      : "the same run as a full fine-tune (lora_rank 0), the baseline",
  sets,
  steps,
  reward_first_3_steps: before,
  reward_last_3_steps: after,
  reward_gain: after - before,
  max_train_rollout_logprob_abs_diff: diffs.length > 0 ? Math.max(...diffs) : null,
  date: new Date().toISOString(),
};
mkdirSync(dirname(values.out), { recursive: true });
writeFileSync(values.out, JSON.stringify(result, null, 2) + "\n");
process.stdout.write(`\nlora-demo: reward ${before.toFixed(3)} -> ${after.toFixed(3)}; wrote ${values.out}\n`);
