import { sglangArgs } from "../fakes/fake-engine-control.ts";
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { spawnFake, spawnRlq, waitFor } from "../helpers/processes.ts";
import { createQueues } from "../../src/queue/queues.ts";
import { createQueueBackend } from "../../src/queue/backend.ts";
import { readEnv } from "../../src/config/env.ts";
import { runStatus } from "../../src/api.ts";

/**
 * Train steps commit once (DESIGN §2): an attempt killed after writing its
 * checkpoint but before committing leaves no trace once the step commits,
 * and the retried step's weights equal an uninterrupted run's; a trainer
 * that stops reporting progress is cancelled and retried; after
 * train_max_attempts the run pauses with its reason and `rlq run resume` continues;
 * a trainer that cannot be reached (restarting) is waited for, using no
 * attempt, up to trainer_unreachable_timeout_s, then the run pauses.
 */
describe("train step faults", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("trainf", { engineArgs: ["--token-delay-ms", "1"], trainerArgs: ["--step-ms", "20"] });
  });
  afterAll(async () => {
    await w?.close();
  });
  const status = async (runId: string) =>
    (await w.db.pool.query("SELECT status, last_error FROM runs WHERE id = $1", [runId])).rows[0] as { status: string; last_error: string | null };

  it("an attempt killed after its checkpoint, before its commit, leaves no trace; the retry reproduces the weights", async () => {
    const config = { deterministic: true, num_rollout: 3, dynamic_sampling_filter_path: null };
    const clean = await w.start(config);
    const up = spawnRlq(["up", "--run", clean, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);

    // Run B: its own engine and trainer; its train worker SIGKILLs itself right before committing step 0.
    const engine = await spawnFake("test/fakes/fake-sglang.ts", sglangArgs(["--token-delay-ms", "1"]));
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

    const shas = async (runId: string) =>
      (await w.db.pool.query("SELECT step, checkpoint_sha256, checkpoint_uri FROM train_steps WHERE run_id = $1 ORDER BY step", [runId])).rows;
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
    const runId = await w.start({
      num_rollout: 3,
      train_stall_timeout_s: 2,
      trainer: { kind: "remote", url: trainer.url },
      engine: { kind: "sglang", urls: [await w.freshEngine()] },
    });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    await waitFor("the run to complete", async () => (await status(runId)).status === "completed", 90_000).catch(async (e: Error) => {
      const st = await fetch(`${trainer.url}/v1/steps/${runId}/1`)
        .then((r) => r.text())
        .catch((x: Error) => x.message);
      const queues = createQueues(createQueueBackend(readEnv({ ...process.env, ...w.env }), w.env.DATABASE_URL as string));
      const info = await queues.info("train", `train-${runId}-1`);
      await queues.close();
      const ts = (await w.db.pool.query("SELECT step, attempt, checkpoint_uri FROM train_steps WHERE run_id = $1", [runId])).rows;
      const ds = (await w.db.pool.query("SELECT seq, kind, step FROM decisions WHERE run_id = $1 ORDER BY seq DESC LIMIT 5", [runId])).rows;
      throw new Error(
        `${e.message}: steps ${JSON.stringify(ts)} decisions ${JSON.stringify(ds)} trainer ${st} job ${JSON.stringify(info)} ${up.output().slice(-4000)}`,
        { cause: e },
      );
    });
    expect(await up.exited, up.output()).toBe(0);
    trainer.kill("SIGTERM");
    const steps = (await w.db.pool.query("SELECT step, attempt FROM train_steps WHERE run_id = $1 ORDER BY step", [runId])).rows;
    expect(steps.map((s) => s.step)).toEqual([0, 1, 2]);
    // Step 1's first attempt (attempt 0) hung; the committed one is a retry.
    expect(steps[1].attempt).toMatch(/^[1-9]\d*-/);
    expect(steps[0].attempt).toMatch(/^0-/);
  });

  it("after train_max_attempts the run pauses with its reason, and rlq run resume continues it", async () => {
    const trainer = await spawnFake("test/fakes/fake-trainer.ts", ["--step-ms", "20", "--fail-step", "1"]);
    const runId = await w.start({
      num_rollout: 3,
      train_max_attempts: 2,
      trainer: { kind: "remote", url: trainer.url },
      engine: { kind: "sglang", urls: [await w.freshEngine()] },
    });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    const paused = await waitFor("the run to pause", async () => {
      const s = await status(runId);
      return s.status === "paused" ? s : null;
    });
    expect(paused.last_error).toMatch(/train job .*-1 failed after 2 attempt\(s\).*injected failure/);
    // Facts so far are intact: step 0 committed, step 1 sealed and not committed.
    const steps = (await w.db.pool.query("SELECT step FROM train_steps WHERE run_id = $1", [runId])).rows;
    expect(steps).toEqual([{ step: 0 }]);

    // --exit-when-done does not wait on a run paused for a fault: it exits non-zero with the reason.
    expect(await up.exited, up.output()).toBe(1);
    expect(up.output()).toMatch(/is paused: train job .*failed after 2 attempt/);
    await fetch(`${trainer.url}/_fault`, { method: "POST", body: JSON.stringify({ fail_step: -1 }) });
    const resume = spawnRlq(["run", "resume", runId], w.env);
    expect(await resume.exited, resume.output()).toBe(0);
    const up2 = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up2.exited, up2.output()).toBe(0);
    expect((await status(runId)).status).toBe("completed");
    const resumed = (await w.db.pool.query("SELECT payload FROM decisions WHERE run_id = $1 AND kind = 'run.status' ORDER BY seq", [runId])).rows.map(
      (r) => r.payload.status,
    );
    expect(resumed).toEqual(["running", "paused", "running", "completed"]);
    trainer.kill("SIGTERM");
  });

  /** A port nothing listens on: a trainer's, once it is stopped. */
  const deadTrainerPort = async (): Promise<string> => {
    const t = await spawnFake("test/fakes/fake-trainer.ts", []);
    t.kill("SIGTERM");
    await t.exited;
    return new URL(t.url).port;
  };
  const bounded = async <T>(p: Promise<T>, ms: number, what: () => string): Promise<T> => {
    let timer: NodeJS.Timeout | undefined;
    try {
      return await Promise.race([p, new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`${what()}`)), ms)))]);
    } finally {
      clearTimeout(timer);
    }
  };

  it("a trainer that is down longer than the retries' backoff is waited for, using no attempt; SIGTERM stops the wait", async () => {
    const port = await deadTrainerPort();
    // train_max_attempts 1: any attempt spent on the outage would pause the run. train_stall_timeout_s 2:
    // the wait below outlasts it, so a watchdog that counted the outage as a stall would too.
    const runId = await w.start({
      num_rollout: 2,
      train_max_attempts: 1,
      train_stall_timeout_s: 2,
      trainer: { kind: "remote", url: `http://127.0.0.1:${port}` },
      engine: { kind: "sglang", urls: [await w.freshEngine()] },
    });
    const queues = createQueues(createQueueBackend(readEnv({ ...process.env, ...w.env }), w.env.DATABASE_URL as string));
    try {
      const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
      // The step-0 job has waited 3 s for the trainer: past the 1.5 s that three attempts' backoff took before.
      const waiting = await waitFor(
        "the train job to wait for the trainer",
        async () => {
          const st = await runStatus(w.db, runId, queues);
          return /unreachable for ([3-9]|\d\d+) s/.test(st.trainJob?.phase ?? "") ? st : null;
        },
        60_000,
        200,
      );
      expect(waiting.status).toBe("running");
      expect(waiting.trainJob).toMatchObject({ step: 0, state: "active", attemptsMade: 0 });
      const shown = spawnRlq(["run", "status", runId], w.env);
      expect(await shown.exited, shown.output()).toBe(0);
      expect(shown.output()).toMatch(/train job: +step 0 active, 0 attempt\(s\) used, waiting for the trainer: unreachable for \d+ s/);

      // SIGTERM ends the wait: the process exits and the job goes back to the queue, its attempt unspent.
      up.kill("SIGTERM");
      await bounded(up.exited, 30_000, () => `rlq up did not exit on SIGTERM while waiting for the trainer:\n${up.output()}`);
      const job = await queues.info("train", `train-${runId}-0`);
      expect(["delayed", "waiting"]).toContain(job.state);
      expect(job.attemptsMade).toBe(0);

      const trainer = await spawnFake("test/fakes/fake-trainer.ts", ["--port", port, "--step-ms", "20"]);
      const up2 = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
      expect(await bounded(up2.exited, 120_000, () => `run did not finish:\n${up2.output()}`), up2.output()).toBe(0);
      trainer.kill("SIGTERM");
      const steps = (await w.db.pool.query("SELECT step, attempt FROM train_steps WHERE run_id = $1 ORDER BY step", [runId])).rows;
      expect(steps.map((r) => r.step)).toEqual([0, 1]);
      // Both steps committed their first attempt.
      for (const r of steps) expect(r.attempt).toMatch(/^0-/);
    } finally {
      await queues.close();
    }
  });

  it("a trainer unreachable for trainer_unreachable_timeout_s pauses the run with that reason; resume continues", async () => {
    const port = await deadTrainerPort();
    const runId = await w.start({
      num_rollout: 2,
      trainer_unreachable_timeout_s: 2,
      trainer: { kind: "remote", url: `http://127.0.0.1:${port}` },
      engine: { kind: "sglang", urls: [await w.freshEngine()] },
    });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    const paused = await waitFor(
      "the run to pause",
      async () => {
        const s = await status(runId);
        return s.status === "paused" ? s : null;
      },
      60_000,
      200,
    );
    expect(paused.last_error).toMatch(/train job .*-0 failed .*unreachable for \d+ s \(trainer_unreachable_timeout_s 2\)/);
    expect((await w.db.pool.query("SELECT count(*)::int AS n FROM train_steps WHERE run_id = $1", [runId])).rows[0].n).toBe(0);

    expect(await up.exited, up.output()).toBe(1);
    const trainer = await spawnFake("test/fakes/fake-trainer.ts", ["--port", port, "--step-ms", "20"]);
    const resume = spawnRlq(["run", "resume", runId], w.env);
    expect(await resume.exited, resume.output()).toBe(0);
    const up2 = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await bounded(up2.exited, 120_000, () => `run did not finish after resume:\n${up2.output()}`), up2.output()).toBe(0);
    trainer.kill("SIGTERM");
    expect((await status(runId)).status).toBe("completed");
    expect((await w.db.pool.query("SELECT step FROM train_steps WHERE run_id = $1 ORDER BY step", [runId])).rows).toEqual([{ step: 0 }, { step: 1 }]);
  });

  it("a trainer killed mid-step and restarted: the poll waits for it, the attempt it forgot counts as one, the next commits", async () => {
    let trainer = await spawnFake("test/fakes/fake-trainer.ts", ["--step-ms", "1000"]);
    const port = new URL(trainer.url).port;
    const runId = await w.start({
      num_rollout: 1,
      train_max_attempts: 2,
      trainer: { kind: "remote", url: trainer.url },
      engine: { kind: "sglang", urls: [await w.freshEngine()] },
    });
    const queues = createQueues(createQueueBackend(readEnv({ ...process.env, ...w.env }), w.env.DATABASE_URL as string));
    try {
      const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
      await waitFor(
        "step 0 to run on the trainer",
        async () => {
          const r = await fetch(`${trainer.url}/v1/steps/${runId}/0`).catch(() => null);
          return r?.ok && ((await r.json()) as { state: string }).state === "running";
        },
        120_000,
        50,
      );
      trainer.kill("SIGKILL");
      await trainer.exited;
      await waitFor(
        "the train job to wait for the trainer",
        async () => /unreachable for [1-9]/.test((await runStatus(w.db, runId, queues)).trainJob?.phase ?? ""),
        60_000,
        100,
      );
      trainer = await spawnFake("test/fakes/fake-trainer.ts", ["--port", port, "--step-ms", "20"]);
      expect(await bounded(up.exited, 120_000, () => `run did not finish:\n${up.output()}`), up.output()).toBe(0);
      trainer.kill("SIGTERM");
      const steps = (await w.db.pool.query("SELECT step, attempt FROM train_steps WHERE run_id = $1", [runId])).rows;
      // The restarted trainer no longer knew attempt 0: it counted as lost, and attempt 1 committed.
      expect(steps).toEqual([{ step: 0, attempt: expect.stringMatching(/^1-/) }]);
    } finally {
      await queues.close();
    }
  });
});
