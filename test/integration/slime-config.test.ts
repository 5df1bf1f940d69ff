import { existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { spawnRlq } from "../helpers/processes.ts";
import { startRun } from "../../src/api.ts";

/**
 * slime's flags that used to be accepted and do nothing, in a real run: save_interval keeps every
 * save_interval-th committed checkpoint (and the ones still loadable), checkpoint_dir (slime's
 * --save) is where they go; a remote engine without a tokenizer source is refused at run start.
 */
describe("slime's save flags and retrain in a run", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("slimecfg", { engineArgs: ["--token-delay-ms", "0"] });
  });
  afterAll(async () => {
    await w?.close();
  });

  it("save_interval 2 over 5 steps keeps steps 1 and 3 (interval) and 3, 4 (newest two) under checkpoint_dir", async () => {
    const runId = await w.start({ num_rollout: 5, save_interval: 2, checkpoint_dir: "ckpt-slime", dynamic_sampling_filter_path: null });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);
    const { rows } = await w.db.pool.query("SELECT status, step FROM runs WHERE id = $1", [runId]);
    expect(rows[0]).toMatchObject({ status: "completed", step: 5 });
    expect(readdirSync(join(w.home, "ckpt-slime", runId)).sort()).toEqual(["step-1", "step-3", "step-4"]);
    expect(existsSync(join(w.home, "checkpoints", runId))).toBe(false);
    const committed = await w.db.pool.query("SELECT step FROM train_steps WHERE run_id = $1 ORDER BY step", [runId]);
    expect(committed.rows.map((r: { step: number }) => Number(r.step))).toEqual([0, 1, 2, 3, 4]);
  });

  it("run start refuses a remote engine with no tokenizer source, and derives hf from hf_checkpoint", async () => {
    const { tokenizer: _, ...noTokenizer } = w.baseConfig();
    await expect(startRun(w.db, { config: noTokenizer })).rejects.toThrow(/tokenizer = \(missing\): engine.kind sglang serves a real model/);
    await expect(startRun(w.db, { config: { ...noTokenizer, hf_checkpoint: join(w.home, "no-such-model") } })).rejects.toThrow(/no-such-model/);
  });

  it("rlq retrain RUN --step S replays the step's recorded batch into the trainer and checks the committed hash (deterministic mode)", async () => {
    const runId = await w.start({ num_rollout: 3, deterministic: true, engine: { kind: "sglang", urls: [await w.freshEngine()] } });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);
    const sha = async (step: number) =>
      (await w.db.pool.query("SELECT checkpoint_sha256 FROM train_steps WHERE run_id = $1 AND step = $2", [runId, step])).rows[0].checkpoint_sha256 as string;

    const same = spawnRlq(["retrain", runId, "--step", "1"], w.env);
    expect(await same.exited, same.output()).toBe(0);
    expect(same.output()).toContain(`weights sha256 ${await sha(1)} == committed ${await sha(1)}`);
    expect(same.output()).toMatch(/pg_loss: committed \S+ {2}retrained \S+/);

    // Step 2 starts from step 1's committed weights: change one byte and the retrained step differs.
    const step1 = (await w.db.pool.query("SELECT checkpoint_uri FROM train_steps WHERE run_id = $1 AND step = 1", [runId])).rows[0].checkpoint_uri as string;
    const file = join(new URL(step1).pathname, "weights.safetensors");
    const bytes = readFileSync(file);
    bytes[0] = (bytes[0] as number) ^ 0xff;
    writeFileSync(file, bytes);
    const differs = spawnRlq(["retrain", runId, "--step", "2"], w.env);
    expect(await differs.exited).toBe(1);
    expect(differs.output()).toMatch(new RegExp(`weights sha256 [0-9a-f]{64} != committed ${await sha(2)} {2}MISMATCH \\(deterministic mode\\)`));

    const missing = spawnRlq(["retrain", runId, "--step", "7"], w.env);
    expect(await missing.exited).toBe(1);
    expect(missing.output()).toMatch(/never dispatched step 7 for training; its committed steps are 0\.\.2/);
    const bad = spawnRlq(["retrain", runId], w.env);
    expect(await bad.exited).toBe(2);
    expect(bad.output()).toMatch(/--step S is required/);
  });
});
