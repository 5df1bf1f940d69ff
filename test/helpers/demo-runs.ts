import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startRun } from "../../src/api.ts";
import { createDb, type Db } from "../../src/store/db.ts";
import { repoRoot, spawnRlq, type Proc } from "./processes.ts";
import { createTestDatabase, redisUrl } from "./services.ts";

/**
 * Runs of the demo task (examples/demo.yaml: the embedded ONNX engine and the
 * jax-js trainer on the committed warm start) against real Redis and Postgres,
 * for the tests and benches that need a model that actually learns. Unlike
 * run-fixture.ts no fake engine or trainer processes are started.
 */
export interface DemoWorld {
  db: Db;
  env: Record<string, string>;
  /** Start a run of examples/demo.yaml with `--set` overrides; returns its id. */
  start(sets: readonly string[], name?: string): Promise<string>;
  /**
   * Drive every started run to completion: one `rlq up` (controllers, rollout and
   * reward workers) plus one train worker with `trainConcurrency` slots, so the
   * train steps of concurrent runs use both cores (each trainer is its own thread).
   */
  driveAll(options?: { trainConcurrency?: number }): Promise<void>;
  close(): Promise<void>;
}

export async function createDemoWorld(name: string): Promise<DemoWorld> {
  const database = await createTestDatabase(`rlq_${name}`);
  const db = createDb(database.url, { max: 4 });
  const home = mkdtempSync(join(tmpdir(), `rlq-${name}-`));
  const prefix = `t${name}${Date.now().toString(36)}`.replace(/[^a-z0-9_]/g, "").toLowerCase();
  const env: Record<string, string> = {
    DATABASE_URL: database.url,
    REDIS_URL: redisUrl,
    RLQ_QUEUE_PREFIX: prefix,
    RLQ_HOME: home,
    RLQ_LOG_LEVEL: process.env.RLQ_TEST_LOG_LEVEL ?? "warn",
  };
  const procs: Proc[] = [];
  return {
    db,
    env,
    async start(sets, runName) {
      const { runId } = await startRun(db, { config: join(repoRoot, "examples/demo.yaml"), set: [...sets], ...(runName !== undefined && { name: runName }) });
      return runId;
    },
    async driveAll(options = {}) {
      const trainer = spawnRlq(["worker", "train", "--concurrency", String(options.trainConcurrency ?? 2)], env);
      const up = spawnRlq(["up", "--exit-when-done", "--workers", "rollout,reward"], env);
      procs.push(trainer, up);
      try {
        const code = await up.exited;
        if (code !== 0) throw new Error(`rlq up exited ${code}:\n${up.output()}\n--- train worker ---\n${trainer.output()}`);
      } finally {
        trainer.kill("SIGTERM");
        await trainer.exited;
      }
    },
    async close() {
      for (const p of procs) p.kill("SIGKILL");
      await db.close();
      await database.drop();
      rmSync(home, { recursive: true, force: true });
    },
  };
}

export interface StepFacts {
  step: number;
  /** Mean raw reward of the samples trained at this step. */
  reward: number;
  /** The step's train_metrics, by key. */
  metrics: Record<string, number>;
}

/** Per train step: the mean reward of its samples (rollout_history) and its train_metrics. */
export async function stepFacts(db: Db, runId: string): Promise<StepFacts[]> {
  const rewards = await db.pool.query<{ step: number; reward: number }>(
    "SELECT trained_step AS step, avg(reward)::float8 AS reward FROM rollout_history WHERE run_id = $1 AND trained_step IS NOT NULL GROUP BY 1 ORDER BY 1",
    [runId],
  );
  const metrics = await db.pool.query<{ step: number; key: string; value: number }>(
    "SELECT step, key, value FROM train_metrics WHERE run_id = $1 ORDER BY step, key",
    [runId],
  );
  return rewards.rows.map((r) => ({
    step: Number(r.step),
    reward: Number(r.reward),
    metrics: Object.fromEntries(metrics.rows.filter((m) => Number(m.step) === Number(r.step)).map((m) => [m.key, Number(m.value)])),
  }));
}

export function mean(xs: readonly number[]): number {
  return xs.length === 0 ? NaN : xs.reduce((a, b) => a + b, 0) / xs.length;
}
