import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startRun } from "../../src/api.ts";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { spawnRlq, waitFor } from "../helpers/processes.ts";

/**
 * slime's debug replay (config/debug-keys.ts). Train only: a run recorded with the fake SGLang
 * engine and the fake trainer (which hashes each batch's tokens, loss masks and rewards into its
 * weights, test/fakes/fake-trainer.ts), then a run with `debug_rollouts_from` on it, which calls
 * no engine (the shared one serves the recorded run's last version: a call would pause or fail the run), must commit the same weights at every
 * step. Rollout only: a run records its history and no train step, and resumes after a SIGKILL.
 */
describe("debug replay", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("dbgreplay", { engineArgs: ["--token-delay-ms", "2"], trainerArgs: ["--step-ms", "20"] });
  });
  afterAll(async () => {
    await w?.close();
  });

  const runToEnd = async (runId: string, workers: string[]) => {
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    const worker = spawnRlq(["worker", ...workers], w.env);
    const code = await up.exited;
    worker.kill("SIGTERM");
    await worker.exited;
    expect(code, up.output()).toBe(0);
  };
  const shas = async (runId: string) =>
    (await w.db.pool.query("SELECT step, checkpoint_sha256 FROM train_steps WHERE run_id = $1 ORDER BY step", [runId])).rows;
  const replayCheck = async (runId: string) => {
    const replay = spawnRlq(["replay", runId, "--check"], w.env);
    expect(await replay.exited, replay.output()).toBe(0);
  };

  it("a train-only run on a recorded run's rollouts commits the recorded run's weights at every step", async () => {
    const config = { deterministic: true, num_rollout: 3 };
    const recorded = await w.start(config);
    await runToEnd(recorded, ["rollout", "reward", "train"]);
    const want = await shas(recorded);
    expect(want).toHaveLength(3);

    // Train only: no rollout worker runs, and the engine is never called.
    const replayed = await w.start({ ...config, debug_rollouts_from: recorded });
    await runToEnd(replayed, ["train"]);
    const batches = async (runId: string) =>
      (
        await w.db.pool.query(
          "SELECT trained_step, group_id, sample_index, reward, tokens, loss_mask, token_versions FROM rollout_history WHERE run_id = $1 AND trained_step IS NOT NULL ORDER BY 1, 2, 3",
          [runId],
        )
      ).rows;
    expect(await batches(replayed)).toEqual(await batches(recorded));
    expect(await shas(replayed)).toEqual(want);
    const jobs = await w.db.pool.query("SELECT DISTINCT job_id LIKE 'replay-%' AS replayed FROM group_rounds WHERE run_id = $1", [replayed]);
    expect(jobs.rows).toEqual([{ replayed: true }]);
    await replayCheck(replayed);

    // A source that does not draw the same prompts is refused at start.
    await expect(w.start({ ...config, debug_rollouts_from: "no-such-run" })).rejects.toThrow(/debug_rollouts_from: run no-such-run does not exist/);
    await expect(w.start({ ...config, debug_rollouts_from: recorded, n_samples_per_prompt: 2 })).rejects.toThrow(
      /has n_samples_per_prompt 4, this run 2: set n_samples_per_prompt: 4/,
    );
  }, 300_000);

  it("a train-only run pauses, naming the draw, when the recorded run has no sample for it", async () => {
    const recorded = await w.start({ deterministic: true, num_rollout: 1, engine: { kind: "sglang", urls: [await w.freshEngine()] } });
    await runToEnd(recorded, ["rollout", "reward", "train"]);
    // One step recorded, three asked: the second step's draws have nothing recorded.
    const { runId } = await startRun(w.db, {
      config: w.baseConfig({ deterministic: true, num_rollout: 3, debug_rollouts_from: recorded }),
    });
    const up = spawnRlq(["up", "--run", runId], w.env);
    const worker = spawnRlq(["worker", "train"], w.env);
    await waitFor(
      "the run to pause",
      async () => (await w.db.pool.query("SELECT status FROM runs WHERE id = $1", [runId])).rows[0]?.status === "paused",
      120_000,
      100,
    );
    up.kill("SIGTERM");
    worker.kill("SIGTERM");
    await Promise.all([up.exited, worker.exited]);
    const row = (await w.db.pool.query("SELECT last_error, step FROM runs WHERE id = $1", [runId])).rows[0];
    expect(row.last_error).toMatch(new RegExp(`debug_rollouts_from: run ${recorded} has no complete scored sample group for draw \\d+`));
    expect(row.step).toBe(1);
  }, 300_000);

  it("a rollout-only run records history and no train step, and resumes after a SIGKILL", async () => {
    const runId = await w.start({ debug_rollout_only: true, num_rollout: 4, engine: { kind: "sglang", urls: [await w.freshEngine()] } });
    const worker = spawnRlq(["worker", "rollout", "reward"], w.env);
    const first = spawnRlq(["up", "--run", runId], w.env);
    await waitFor(
      "the second step",
      async () =>
        (await w.db.pool.query("SELECT 1 FROM decisions WHERE run_id = $1 AND kind = 'step.started' AND (payload->>'step')::int = 1", [runId])).rowCount,
      120_000,
      20,
    );
    first.kill("SIGKILL");
    await first.exited;
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);
    worker.kill("SIGTERM");
    await worker.exited;

    const run = (await w.db.pool.query("SELECT status, weight_version FROM runs WHERE id = $1", [runId])).rows[0];
    expect(run).toEqual({ status: "completed", weight_version: 0 });
    expect((await w.db.pool.query("SELECT count(*)::int AS n FROM train_steps WHERE run_id = $1", [runId])).rows[0].n).toBe(0);
    expect((await w.db.pool.query("SELECT count(*)::int AS n FROM decisions WHERE run_id = $1 AND kind LIKE 'train.%'", [runId])).rows[0].n).toBe(0);
    // Every step sealed rollout_batch_size kept groups of n_samples_per_prompt samples, recorded in history.
    const kept = await w.db.pool.query(
      "SELECT step, count(*)::int AS n FROM rollout_history WHERE run_id = $1 AND outcome = 'kept' AND trained_step IS NULL GROUP BY 1 ORDER BY 1",
      [runId],
    );
    expect(kept.rows).toEqual([0, 1, 2, 3].map((step) => ({ step, n: 16 })));
    await replayCheck(runId);
  }, 300_000);
});
