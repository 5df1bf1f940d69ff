import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTorchTrainer, type Server } from "../../scripts/real-stack.ts";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { repoRoot, runChecked, spawnRlq } from "../helpers/processes.ts";
import { requirePythonModules } from "../helpers/python.ts";

/**
 * RL on a tiny vision-language model, end to end: scripts/make-vlm-task.py makes the task ("which square is
 * larger, red or blue", pictures drawn with numpy) and a tiny random Qwen2-VL warmed on it by supervised steps
 * until its expected reward reaches 0.6; `rlq up` then runs GRPO on it with the torch trainer (weight_sync disk: each
 * committed checkpoint is loaded by the engine before the next step's rollouts).
 *
 * The engine is the fake SGLang reading image_data as SGLang does, its tokens and log-probs drawn by the model
 * itself (test/fakes/hf-vlm-policy.py, which expands the image placeholders as SGLang's Qwen2-VL processor
 * does): vLLM's CPU build here cannot load Qwen2-VL without torchvision, which this environment cannot install
 * (docs/engines.md, "Images"), and SGLang is not installed.
 *
 * What it shows: the run completes; at every step the trainer's log-probs of the sampled tokens (its own
 * processor expanding the same prompt ids, workers/trainer-torch/rlq_torch/vlm.py) equal the engine's within
 * MISMATCH_BOUND, so the images reached both sides alike and every version the engine served was the trained
 * one; and the task reward rises by at least REWARD_RISE from the first steps to the last.
 */
const python = requirePythonModules(["torch", "transformers", "PIL"]);

const STEPS = 20;
/**
 * Mean |train - rollout| log-prob per step (train_rollout_logprob_abs_diff). Both sides run the same fp32
 * transformers model on the CPU, so only summation order separates them; a missed weight load, an image that
 * did not reach one side, or other prompt ids would put it orders of magnitude higher.
 */
const MISMATCH_BOUND = 1e-6;
/** Mean reward of the last three steps minus the first three's (the model starts at about 0.6). */
const REWARD_RISE = 0.1;

interface Proc {
  url: string;
  child: ChildProcess;
  log(): string;
}

/** The model behind the fake SGLang; resolves once it prints its port. */
function startPolicy(model: string): Promise<Proc> {
  const child = spawn(python, [join(repoRoot, "test/fakes/hf-vlm-policy.py"), model], { cwd: repoRoot, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr.on("data", (d: Buffer) => (out = (out + d.toString()).slice(-20_000)));
  return new Promise((resolve, reject) => {
    child.stdout.on("data", () => {
      const m = /listening (\d+)/.exec(out);
      if (m) resolve({ url: `http://127.0.0.1:${m[1]}`, child, log: () => out });
    });
    child.once("exit", (c) => reject(new Error(`the policy exited (${c}) before listening:\n${out}`)));
  });
}

describe("RL on a tiny vision-language model (fake SGLang drawing from the model, torch trainer)", () => {
  let w: World;
  let policy: Proc | undefined;
  let trainer: Server | undefined;
  let dir = "";
  let warm = 0;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "rlq-vlm-run-"));
    const made = await runChecked(python, [join(repoRoot, "scripts/make-vlm-task.py"), dir, "--seed", "0"], { timeoutMs: 300_000 });
    warm = (JSON.parse(made.trim().split("\n").pop() as string) as { expected_reward: number }).expected_reward;
    policy = await startPolicy(join(dir, "model"));
    [w, trainer] = await Promise.all([createWorld("vlmrun", { engineArgs: ["--policy-url", policy.url] }), startTorchTrainer(python, ["--threads", "1"])]);
  }, 600_000);

  afterAll(async () => {
    policy?.child.kill("SIGKILL");
    await trainer?.stop(2_000);
    await w?.close();
  });

  it("completes; the train/rollout log-prob mismatch stays under the bound at every step; the reward rises", async () => {
    const model = join(dir, "model");
    const runId = await w.start({
      prompt_data: join(dir, "data", "train.jsonl"),
      multimodal_keys: { image: "images" },
      apply_chat_template: true,
      hf_checkpoint: model,
      tokenizer: "hf",
      rm_type: "exact_match",
      custom_rm_path: null,
      dynamic_sampling_filter_path: null,
      over_sampling_batch_size: null,
      rollout_batch_size: 32,
      n_samples_per_prompt: 8,
      num_rollout: STEPS,
      rollout_max_response_len: 4,
      rollout_temperature: 1,
      rollout_shuffle: true,
      advantage_estimator: "grpo",
      lr: 1e-3,
      deterministic: true,
      get_mismatch_metrics: true,
      weight_sync: "disk",
      trainer: { kind: "remote", url: (trainer as Server).url },
      train_stall_timeout_s: 300,
    });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up.exited, `${up.output()}\n--- trainer ---\n${trainer?.log().slice(-4000)}\n--- policy ---\n${policy?.log().slice(-4000)}`).toBe(0);

    const steps = await w.db.pool.query<{ step: number }>("SELECT step FROM train_steps WHERE run_id = $1 ORDER BY step", [runId]);
    expect(steps.rows.map((r) => r.step)).toEqual(Array.from({ length: STEPS }, (_, i) => i));

    const byStep = await w.db.pool.query<{ step: number; reward: number; n: string; versions: number[] }>(
      `SELECT trained_step AS step, avg(reward)::float8 AS reward, count(*) AS n,
              (SELECT array_agg(DISTINCT v) FROM rollout_history h2, unnest(h2.token_versions) v
                WHERE h2.run_id = h.run_id AND h2.trained_step = h.trained_step) AS versions
         FROM rollout_history h WHERE run_id = $1 AND trained_step IS NOT NULL GROUP BY run_id, trained_step ORDER BY trained_step`,
      [runId],
    );
    const diffs = await w.db.pool.query<{ step: number; value: number }>(
      "SELECT step, value FROM train_metrics WHERE run_id = $1 AND key = 'train_rollout_logprob_abs_diff' ORDER BY step",
      [runId],
    );
    console.log(
      `vlm run (warm expected reward ${warm}): reward by step ${JSON.stringify(byStep.rows.map((r) => Number(r.reward.toFixed(3))))}, ` +
        `mismatch by step ${JSON.stringify(diffs.rows.map((r) => r.value))}`,
    );
    // Step k trained version k's samples: the engine loaded every committed checkpoint.
    expect(byStep.rows.map((r) => r.versions)).toEqual(byStep.rows.map((r) => [r.step]));
    expect(diffs.rows.map((r) => r.step)).toEqual(Array.from({ length: STEPS }, (_, i) => i));
    for (const d of diffs.rows) expect(d.value, `step ${d.step}`).toBeLessThan(MISMATCH_BOUND);
    const rewards = byStep.rows.map((r) => r.reward);
    const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
    const rise = mean(rewards.slice(-3)) - mean(rewards.slice(0, 3));
    expect(rise, `rewards by step ${JSON.stringify(rewards)}`).toBeGreaterThanOrEqual(REWARD_RISE);
  }, 600_000);
});
