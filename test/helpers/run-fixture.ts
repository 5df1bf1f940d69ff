import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createDb, type Db } from "../../src/store/db.ts";
import { startRun } from "../../src/api.ts";
import { createTestDatabase, redisUrl } from "./services.ts";
import { repoRoot, spawnFake, type Proc } from "./processes.ts";
import { sglangArgs } from "../fakes/fake-engine-control.ts";

/**
 * One integration test's world: its own database and queue prefix, a fake
 * SGLang server and a fake trainer as separate processes, and the env that
 * rlq processes need to join them.
 */
export interface World {
  db: Db;
  env: Record<string, string>;
  engine: Proc & { url: string };
  trainer: Proc & { url: string };
  home: string;
  baseConfig(overrides?: Record<string, unknown>): Record<string, unknown>;
  start(overrides?: Record<string, unknown>): Promise<string>;
  /** A fresh engine process (serving version 0), stopped with the world: runs that must not share weight versions each get one. */
  freshEngine(args?: string[]): Promise<string>;
  close(): Promise<void>;
}

export async function createWorld(name: string, options: { queue?: "redis" | "postgres"; engineArgs?: string[]; trainerArgs?: string[] } = {}): Promise<World> {
  const database = await createTestDatabase(`rlq_${name}`);
  const db = createDb(database.url, { max: 4 });
  const engine = await spawnFake("test/fakes/fake-sglang.ts", sglangArgs(options.engineArgs ?? []));
  const trainer = await spawnFake("test/fakes/fake-trainer.ts", options.trainerArgs ?? []);
  const extra: Proc[] = [];
  const home = mkdtempSync(join(tmpdir(), `rlq-${name}-`));
  const prefix = `t${name}${Date.now().toString(36)}`.replace(/[^a-z0-9_]/g, "").toLowerCase();
  const env: Record<string, string> = {
    DATABASE_URL: database.url,
    RLQ_QUEUE_PREFIX: prefix,
    RLQ_HOME: home,
    RLQ_LOG_LEVEL: process.env.RLQ_TEST_LOG_LEVEL ?? "warn",
    ...(options.queue === "postgres" ? {} : { REDIS_URL: redisUrl }),
  };
  const baseConfig = (overrides: Record<string, unknown> = {}) => ({
    prompt_data: join(repoRoot, "test/fixtures/prompts.jsonl"),
    rollout_batch_size: 4,
    n_samples_per_prompt: 4,
    over_sampling_batch_size: 6,
    num_rollout: 3,
    rollout_max_response_len: 24,
    custom_rm_path: join(repoRoot, "test/fixtures/reward-parity.mjs"),
    dynamic_sampling_filter_path: "check_reward_nonzero_std",
    engine: { kind: "sglang", urls: [engine.url] },
    // The fake SGLang server speaks rlq's byte ids (a real one needs hf_checkpoint).
    tokenizer: "bytes",
    trainer: { kind: "remote", url: trainer.url },
    train_stall_timeout_s: 10,
    ...overrides,
  });
  return {
    db,
    env,
    engine,
    trainer,
    home,
    baseConfig,
    async start(overrides = {}) {
      const { runId } = await startRun(db, { config: baseConfig(overrides) });
      return runId;
    },
    async freshEngine(args = options.engineArgs ?? []) {
      const p = await spawnFake("test/fakes/fake-sglang.ts", sglangArgs(args));
      extra.push(p);
      return p.url;
    },
    async close() {
      for (const p of extra) p.kill("SIGTERM");
      engine.kill("SIGTERM");
      trainer.kill("SIGTERM");
      await db.close();
      await database.drop();
    },
  };
}
