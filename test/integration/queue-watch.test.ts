import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runStatus } from "../../src/api.ts";
import { formatStatus } from "../../src/cli/format-status.ts";
import { readEnv } from "../../src/config/env.ts";
import { createQueueBackend, type QueueBackend } from "../../src/queue/backend.ts";
import { createQueues, type Queues } from "../../src/queue/queues.ts";
import { spawnRlq, waitFor, type Proc } from "../helpers/processes.ts";
import { createWorld, type World } from "../helpers/run-fixture.ts";

/**
 * The queue watch (queue/queue-watch.ts, called from the controllers' reconcile): a queue paused
 * or obliterated behind rlq's back, with BullMQ's own Queue from the test, is seen, reported in
 * `rlq run status` (the report and its text) and repaired, and the run completes by itself.
 * Each change lands after the run's first train step: the rest of the run needs new rollout jobs,
 * so it completes only if rlq resumes the queue and adds the lost jobs back.
 */
describe("the queue watch", () => {
  let w: World;
  let backend: QueueBackend;
  let queues: Queues;
  let rollout: InstanceType<QueueBackend["Queue"]>;
  const procs: Proc[] = [];

  beforeAll(async () => {
    w = await createWorld("qwatch", { engineArgs: ["--token-delay-ms", "15", "--stop-prob", "0.03"], trainerArgs: ["--step-ms", "100"] });
    backend = createQueueBackend(readEnv(w.env), w.env.DATABASE_URL as string);
    queues = createQueues(backend);
    // BullMQ's own Queue, as an operator's script would open it.
    rollout = new backend.Queue("rlq-rollout", { connection: backend.connection, ...backend.baseOptions });
  });
  afterAll(async () => {
    for (const p of procs) p.kill("SIGKILL");
    await rollout?.close();
    await queues?.close();
    await backend?.wipe();
    await w?.close();
  });

  const committedSteps = async (runId: string) =>
    Number((await w.db.pool.query<{ n: string }>("SELECT count(*) AS n FROM train_steps WHERE run_id = $1", [runId])).rows[0]?.n ?? 0);

  async function runWith(change: (runId: string) => Promise<void>, sees: (report: Awaited<ReturnType<typeof runStatus>>) => boolean) {
    // Each run gets an engine of its own at version 0 (the first run leaves its engine at version 4).
    const runId = await w.start({ num_rollout: 4, engine: { kind: "sglang", urls: [await w.freshEngine()] } });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    procs.push(up);
    await waitFor("the first train step", async () => (await committedSteps(runId)) >= 1, 120_000, 100);
    await change(runId);
    const report = await waitFor(
      "rlq run status to report the change",
      async () => {
        const r = await runStatus(w.db, runId, queues);
        return sees(r) ? r : null;
      },
      60_000,
      200,
    );
    expect(await up.exited, up.output()).toBe(0);
    expect(await committedSteps(runId)).toBe(4);
    return { runId, report };
  }

  it("a queue paused behind rlq's back shows in status within seconds, is resumed, and the run completes", async () => {
    const { report } = await runWith(
      () => rollout.pause(),
      (r) => r.queueWatch?.events.some((e) => e.queue === "rlq-rollout" && e.kind === "paused" && e.action === "resumed") === true,
    );
    expect(formatStatus(report)).toMatch(/queue watch:[\s\S]*paused \(resumed by rlq\): rlq-rollout was paused outside rlq/);
    expect(await rollout.isPaused()).toBe(false);
  });

  it("an obliterated queue is noticed, its lost jobs are added back, and the run completes", async () => {
    const { runId, report } = await runWith(
      async () => {
        // Obliterate while rollout jobs wait in the queue: those jobs never ran, so their facts are missing.
        await waitFor("rollout jobs waiting", async () => (await rollout.getJobCounts("waiting")).waiting > 0, 60_000, 20);
        await rollout.obliterate({ force: true });
      },
      (r) => {
        const kinds = new Set(r.queueWatch?.events.filter((e) => e.queue === "rlq-rollout").map((e) => e.kind));
        return kinds.has("emptied") && kinds.has("jobs_missing");
      },
    );
    const missing = report.queueWatch?.events.find((e) => e.kind === "jobs_missing");
    expect(missing).toMatchObject({ runId, action: "re_added" });
    expect(formatStatus(report)).toMatch(/emptied \(meta restored\): rlq-rollout lost its state/);
    expect(formatStatus(report)).toMatch(/jobs missing \(jobs added back\): \d+ job\(s\) of run /);
  });
});
