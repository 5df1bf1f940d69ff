import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startRun } from "../../src/api.ts";
import { createDb, type Db } from "../../src/store/db.ts";
import { loadRunWeightVersion } from "../../src/store/run-facts.ts";
import { fixtureModel, freePort, startTorchTrainer, startVllm, type Server } from "../../scripts/real-stack.ts";
import { repoRoot, spawnRlq } from "../helpers/processes.ts";
import { requirePythonModules } from "../helpers/python.ts";
import { createTestDatabase, redisUrl } from "../helpers/services.ts";

/**
 * weight_sync trainer_push on the real stack: the PyTorch trainer pushes each trained version into a
 * real vLLM server on the CPU through vLLM's own weight transfer routes (pause, start, update,
 * finish with the version, resume), over rlq's gloo backend (workers/trainer-torch/rlq_torch/vllm_gloo.py;
 * the server runs as `python -m rlq_torch.vllm_serve --weight-transfer-config '{"backend": "gloo"}'`,
 * the trainer with --push-via vllm-gloo). rlq sends no weights: it waits for /weight_info to report
 * each version. Step k's samples are version k's, the train/rollout log-prob difference stays at
 * float noise every step (which holds only if vLLM serves exactly the trained weights), and the
 * server ends on the version rlq recorded.
 */
const python = requirePythonModules(["torch", "transformers", "vllm"]);

describe("trainer_push into vLLM (CPU) over the gloo weight transfer backend", () => {
  let vllm: Server | undefined;
  let trainer: Server | undefined;
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let db: Db;
  let env: Record<string, string>;
  let model: string;

  beforeAll(async () => {
    model = await fixtureModel(python);
    database = await createTestDatabase("rlq_realpush");
    db = createDb(database.url, { max: 4 });
    env = {
      DATABASE_URL: database.url,
      REDIS_URL: redisUrl,
      RLQ_QUEUE_PREFIX: `trealpush${Date.now().toString(36)}`,
      RLQ_LOG_LEVEL: process.env.RLQ_TEST_LOG_LEVEL ?? "warn",
    };
    vllm = await startVllm({ python, model, servedModelName: "fixture", isGlooPushTarget: true });
    const pushPort = await freePort();
    trainer = await startTorchTrainer(python, [
      "--threads",
      "1",
      "--push-engines",
      vllm.url,
      "--push-via",
      "vllm-gloo",
      "--push-master-address",
      "127.0.0.1",
      "--push-master-port",
      String(pushPort),
    ]);
  }, 900_000);

  afterAll(async () => {
    await Promise.all([vllm?.stop(), trainer?.stop()]);
    await db?.close();
    await database?.drop();
  });

  it("every step trains on-policy on the version the trainer pushed, and vLLM ends on rlq's recorded version", async () => {
    const { runId } = await startRun(db, {
      config: {
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
        weight_sync: "trainer_push",
        trainer: { kind: "remote", url: (trainer as Server).url },
        train_stall_timeout_s: 300,
      },
    });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], env);
    expect(await up.exited, `${up.output()}\n--- trainer ---\n${trainer?.log().slice(-4000)}\n--- vllm ---\n${vllm?.log().slice(-4000)}`).toBe(0);
    // The trainer pushed every version (its log names each push).
    for (const v of [1, 2, 3]) expect(trainer?.log()).toMatch(new RegExp(`pushed version ${v}: \\d+ tensors via vllm-gloo`));

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
    const diffs = await db.pool.query<{ step: number; value: number }>(
      "SELECT step, value FROM train_metrics WHERE run_id = $1 AND key = 'train_rollout_logprob_abs_diff' ORDER BY step",
      [runId],
    );
    console.log(`trainer_push (gloo), train/rollout log-prob diff by step: ${JSON.stringify(diffs.rows)}`);
    expect(diffs.rows.map((r) => r.step)).toEqual([0, 1, 2]);
    for (const d of diffs.rows) expect(d.value, `step ${d.step}`).toBeLessThan(1e-4);

    const recorded = await loadRunWeightVersion(db, runId);
    expect(recorded).toBe(3);
    const info = (await (await fetch(`${(vllm as Server).url}/weight_info`)).json()) as { weight_version: string };
    expect(info.weight_version).toBe(String(recorded));
  }, 900_000);
});
