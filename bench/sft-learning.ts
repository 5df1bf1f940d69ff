/**
 * SFT as a run mode learns the demo task from scratch: a random-init model of the demo's
 * architecture (written here from a seed: src/model/weights.ts initWeights, the demo's config and
 * tokenizer) trained by an SFT run (loss_type sft_loss, docs/sft.md) on the demo's train split with
 * its solutions (`\boxed{sum}`) as responses, by the PyTorch trainer (workers/trainer-torch/server.py
 * --device cpu), with no rollouts. Evals on the held-out split (examples/demo/eval.jsonl, prompts
 * the train split does not hold), greedy (eval_top_k 1), graded by slime's math grader, every
 * --eval-every steps: the share of held-out prompts solved. The run passes when the last eval
 * reaches --target. Writes bench/results/sft-learning.json. Needs Postgres and Redis.
 *
 *   npx tsx bench/sft-learning.ts [--steps 1000] [--eval-every 100] [--target 0.8] [--seed 7]
 */
import { spawn } from "node:child_process";
import { copyFileSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { startRun } from "../src/api.ts";
import { writeCheckpoint } from "../src/model/checkpoint.ts";
import { parseModelConfig } from "../src/model/config.ts";
import { initWeights } from "../src/model/weights.ts";
import setupServices from "../test/helpers/global-setup.ts";
import { createDemoWorld } from "../test/helpers/demo-runs.ts";
import { repoRoot, spawnRlq } from "../test/helpers/processes.ts";
import { rlqPython } from "../test/helpers/python.ts";
import { writeResult } from "./lib.ts";

const { values } = parseArgs({
  options: {
    steps: { type: "string", default: "1000" },
    "eval-every": { type: "string", default: "100" },
    target: { type: "string", default: "0.8" },
    seed: { type: "string", default: "7" },
    batch: { type: "string", default: "128" },
  },
});
const steps = Number(values.steps);
const evalEvery = Number(values["eval-every"]);
const target = Number(values.target);
const seed = Number(values.seed);
const batch = Number(values.batch);

// The demo model's architecture (examples/demo/build-info.json).
const MODEL = { vocab_size: 24, context_length: 32, d_model: 64, n_heads: 4, n_layers: 2, d_mlp: 256, layer_norm_eps: 1e-5 };

await setupServices();
const dir = mkdtempSync(join(tmpdir(), "rlq-sft-bench-"));
const init = join(dir, "random-init");
await writeCheckpoint(init, {
  config: parseModelConfig(MODEL),
  weights: initWeights(parseModelConfig(MODEL), seed),
  version: 0,
  runId: "sft-random-init",
  step: -1,
});
// tokenizer: model reads tokenizer.json in or beside ref_load.
copyFileSync(join(repoRoot, "examples/demo/tokenizer.json"), join(dir, "tokenizer.json"));
const data = join(dir, "sft-train.jsonl");
const rows = readFileSync(join(repoRoot, "examples/demo/train.jsonl"), "utf8")
  .split("\n")
  .filter((l) => l.trim() !== "")
  .map((l) => JSON.parse(l) as { input: string; label: string });
writeFileSync(data, rows.map((r) => JSON.stringify({ input: r.input, response: `\\boxed{${r.label}}` })).join("\n") + "\n");

const trainer = spawn(rlqPython(), [join(repoRoot, "workers/trainer-torch/server.py"), "--port", "0", "--device", "cpu", "--threads", "1"], {
  cwd: repoRoot,
  stdio: ["ignore", "pipe", "pipe"],
});
let trainerLog = "";
trainer.stderr.on("data", (d: Buffer) => (trainerLog = (trainerLog + d.toString()).slice(-20_000)));
const port = await new Promise<number>((resolve, reject) => {
  let out = "";
  trainer.stdout.on("data", (d: Buffer) => {
    out += d.toString();
    const m = /listening (\d+)/.exec(out);
    if (m) resolve(Number(m[1]));
  });
  trainer.on("exit", (c) => reject(new Error(`trainer exited (${c}) before listening: ${trainerLog}`)));
});

const w = await createDemoWorld("bsft");
const t0 = Date.now();
try {
  const config = {
    prompt_data: data,
    label_key: "response",
    loss_type: "sft_loss",
    tokenizer: "model",
    ref_load: init,
    rm_type: "math",
    rollout_batch_size: batch,
    n_samples_per_prompt: 1,
    num_rollout: steps,
    rollout_max_response_len: 8,
    rollout_stop_token_ids: [2],
    rollout_shuffle: true,
    // The demo warm start's own supervised recipe (scripts/build-demo-checkpoint.ts): token-mean loss, lr 3e-3 after 100 warmup steps.
    calculate_per_token_loss: true,
    lr: 3e-3,
    lr_warmup_iters: 100,
    adam_beta2: 0.99,
    weight_decay: 0.01,
    eval_prompt_data: { heldout: join(repoRoot, "examples/demo/eval.jsonl") },
    // label_key names the training response; the eval rows' answers are under "label".
    eval_label_key: "label",
    eval_interval: evalEvery,
    eval_top_k: 1,
    // The engine only serves the evals: load the weights when an eval is due.
    update_weights_interval: evalEvery,
    engine: { kind: "embedded" },
    trainer: { kind: "remote", url: `http://127.0.0.1:${port}` },
  };
  const { runId } = await startRun(w.db, { config, name: "sft-learning" });
  const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
  const code = await up.exited;
  if (code !== 0) throw new Error(`rlq up exited ${code}:\n${up.output().slice(-4000)}\n--- trainer ---\n${trainerLog}`);
  const wallS = (Date.now() - t0) / 1000;
  const evals = (
    await w.db.pool.query("SELECT step, mean_reward, num_prompts FROM eval_results WHERE run_id = $1 AND dataset = 'heldout' ORDER BY step", [runId])
  ).rows.map((r) => ({ step: Number(r.step), solved_share: round(Number(r.mean_reward)), prompts: Number(r.num_prompts) }));
  const loss = (await w.db.pool.query("SELECT step, value FROM train_metrics WHERE run_id = $1 AND key = 'loss' ORDER BY step", [runId])).rows.map((r) => ({
    step: Number(r.step),
    loss: Number(r.value),
  }));
  const trained = (await w.db.pool.query("SELECT count(*)::int AS n FROM train_steps WHERE run_id = $1", [runId])).rows[0].n as number;
  const last = evals.at(-1);
  const result = {
    bench: "sft-learning",
    task: "examples/demo (two-number addition, answered \\boxed{sum}); held-out: examples/demo/eval.jsonl, greedy, slime's math grader",
    model: { ...MODEL, init: `random (initWeights seed ${seed})` },
    trainer: "workers/trainer-torch/server.py --device cpu --threads 1",
    steps,
    steps_trained: trained,
    rollout_batch_size: batch,
    eval_every: evalEvery,
    target_solved_share: target,
    final_solved_share: last?.solved_share ?? null,
    passed: last !== undefined && last.solved_share >= target,
    wall_s: round(wallS),
    evals,
    loss_every_eval: loss.filter((l) => l.step % evalEvery === 0 || l.step === loss.length - 1).map((l) => ({ step: l.step, loss: round(l.loss) })),
    run_id: runId,
  };
  await writeResult("sft-learning", result);
  process.stderr.write(`held-out solved: ${evals.map((e) => `${e.step}:${e.solved_share}`).join(" ")} (target ${target}); ${wallS.toFixed(0)} s\n`);
  if (!result.passed) process.exitCode = 1;
} finally {
  trainer.kill("SIGKILL");
  await w.close();
}

function round(x: number): number {
  return Number.isFinite(x) ? Number(x.toPrecision(4)) : x;
}
