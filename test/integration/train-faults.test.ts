import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { spawnFake, spawnRlq, waitFor } from "../helpers/processes.ts";
import { createQueues } from "../../src/queue/queues.ts";
import { createQueueBackend } from "../../src/queue/backend.ts";
import { readEnv } from "../../src/config/env.ts";

/**
 * Train steps commit once (DESIGN §2): an attempt killed after writing its
 * checkpoint but before committing leaves no trace once the step commits,
 * and the retried step's weights equal an uninterrupted run's; a trainer
 * that stops reporting progress is cancelled and retried; after
 * max_attempts the run pauses with its reason and `rlq run resume` continues.
 */
describe("train step faults", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("trainf", { engineArgs: ["--token-delay-ms", "1"], trainerArgs: ["--step-ms", "20"] });
  });
  afterAll(async () => {
    await w?.close();
  });
  const status = async (runId: string) => (await w.db.pool.query("SELECT status, last_error FROM runs WHERE id = $1", [runId])).rows[0] as { status: string; last_error: string | null };

  it("an attempt killed after its checkpoint, before its commit, leaves no trace; the retry reproduces the weights", async () => {
    const config = { deterministic: true, num_rollout: 3, dynamic_sampling_filter_path: null };
    const clean = await w.start(config);
    const up = spawnRlq(["up", "--run", clean, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);

    // Run B: its own engine and trainer; its train worker SIGKILLs itself right before committing step 0.
    const engine = await spawnFake("test/fakes/fake-sglang.ts", ["--token-delay-ms", "1"]);
    let trainer = await spawnFake("test/fakes/fake-trainer.ts", ["--step-ms", "20"]);
    const port = new URL(trainer.url).port;
    const runB = await w.start({ ...config, engine: { kind: "sglang", urls: [engine.url] }, trainer: { kind: "remote", url: trainer.url } });
    const marker = join(w.home, "crashed-before-commit");
    const ctl = spawnRlq(["up", "--run", runB, "--workers", "rollout,reward"], w.env);
    const trainWorker = spawnRlq(["worker", "train"], { ...w.env, RLQ_CRASH_AT: `train.before_commit:once=${marker}` });
    expect(await trainWorker.exited).toBe("SIGKILL");
    expect(existsSync(marker)).toBe(true);
    // The trainer process dies with it (it forgets the finished attempt), so the retry trains again.
    trainer.kill("SIGKILL");
    await trainer.exited;
    trainer = await spawnFake("test/fakes/fake-trainer.ts", ["--port", port, "--step-ms", "20"]);
    const trainWorker2 = spawnRlq(["worker", "train"], w.env);
    await waitFor("run B to complete", async () => (await status(runB)).status === "completed", 120_000, 200);
    ctl.kill("SIGTERM");
    trainWorker2.kill("SIGTERM");
    await Promise.all([ctl.exited, trainWorker2.exited]);
    engine.kill("SIGTERM");
    trainer.kill("SIGTERM");

    const shas = async (runId: string) => (await w.db.pool.query("SELECT step, checkpoint_sha256, checkpoint_uri FROM train_steps WHERE run_id = $1 ORDER BY step", [runId])).rows;
    const a = await shas(clean);
    const b = await shas(runB);
    expect(b.map((r) => r.checkpoint_sha256)).toEqual(a.map((r) => r.checkpoint_sha256));
    for (const row of b) {
      const stepDir = join(w.home, "checkpoints", runB, `step-${row.step}`);
      // Only the committed attempt's directory remains.
      expect(readdirSync(stepDir)).toEqual([String(row.checkpoint_uri).split("/").pop()]);
    }
  });

  it("a trainer that stops reporting progress is cancelled and retried", async () => {
    const trainer = await spawnFake("test/fakes/fake-trainer.ts", ["--step-ms", "20", "--hang-step", "1"]);
    const runId = await w.start({ num_rollout: 3, train_stall_timeout_s: 2, trainer: { kind: "remote", url: trainer.url }, engine: { kind: "sglang", urls: [await w.freshEngine()] } });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    await waitFor("the run to complete", async () => (await status(runId)).status === "completed", 90_000).catch(async (e: Error) => {
      const st = await fetch(`${trainer.url}/v1/steps/${runId}/1`).then((r) => r.text()).catch((x: Error) => x.message);
      const queues = createQueues(createQueueBackend(readEnv({ ...process.env, ...w.env }), w.env.DATABASE_URL as string));
      const info = await queues.info("train", `train-${runId}-1`);
      await queues.close();
      const ts = (await w.db.pool.query("SELECT step, attempt, checkpoint_uri FROM train_steps WHERE run_id = $1", [runId])).rows;
      const ds = (await w.db.pool.query("SELECT seq, kind, step FROM decisions WHERE run_id = $1 ORDER BY seq DESC LIMIT 5", [runId])).rows;
      throw new Error(`${e.message}: steps ${JSON.stringify(ts)} decisions ${JSON.stringify(ds)} trainer ${st} job ${JSON.stringify(info)} ${up.output().slice(-4000)}`, { cause: e });
    });
    expect(await up.exited, up.output()).toBe(0);
    trainer.kill("SIGTERM");
    const steps = (await w.db.pool.query("SELECT step, attempt FROM train_steps WHERE run_id = $1 ORDER BY step", [runId])).rows;
    expect(steps.map((s) => s.step)).toEqual([0, 1, 2]);
    // Step 1's first attempt (attempt 0) hung; the committed one is a retry.
    expect(steps[1].attempt).toMatch(/^[1-9]\d*-/);
    expect(steps[0].attempt).toMatch(/^0-/);
  });

  it("after max_attempts the run pauses with its reason, and rlq run resume continues it", async () => {
    const trainer = await spawnFake("test/fakes/fake-trainer.ts", ["--step-ms", "20", "--fail-step", "1"]);
    const runId = await w.start({ num_rollout: 3, max_attempts: 2, trainer: { kind: "remote", url: trainer.url }, engine: { kind: "sglang", urls: [await w.freshEngine()] } });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    const paused = await waitFor("the run to pause", async () => {
      const s = await status(runId);
      return s.status === "paused" ? s : null;
    });
    expect(paused.last_error).toMatch(/train job .*-1 failed after 2 attempt\(s\).*injected failure/);
    // Facts so far are intact: step 0 committed, step 1 sealed and not committed.
    const steps = (await w.db.pool.query("SELECT step FROM train_steps WHERE run_id = $1", [runId])).rows;
    expect(steps).toEqual([{ step: 0 }]);

    await fetch(`${trainer.url}/_fault`, { method: "POST", body: JSON.stringify({ fail_step: -1 }) });
    const resume = spawnRlq(["run", "resume", runId], w.env);
    expect(await resume.exited, resume.output()).toBe(0);
    expect(await up.exited, up.output()).toBe(0);
    expect((await status(runId)).status).toBe("completed");
    const resumed = (await w.db.pool.query("SELECT payload FROM decisions WHERE run_id = $1 AND kind = 'run.status' ORDER BY seq", [runId])).rows.map((r) => r.payload.status);
    expect(resumed).toEqual(["running", "paused", "running", "completed"]);
    trainer.kill("SIGTERM");
  });
});
