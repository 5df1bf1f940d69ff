import { chromium } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runStatus } from "../../src/api.ts";
import { formatStatus } from "../../src/cli/format-status.ts";
import { readEnv } from "../../src/config/env.ts";
import { createQueueBackend, type QueueBackend } from "../../src/queue/backend.ts";
import { createQueues, type Queues } from "../../src/queue/queues.ts";
import { startDashboard } from "../../src/dashboard/server.ts";
import { createRunContextCache } from "../../src/runtime/run-context.ts";
import { createDb } from "../../src/store/db.ts";
import { chromiumArgs, ensureChromium } from "../helpers/chromium.ts";
import { spawnRlq, waitFor, type Proc } from "../helpers/processes.ts";
import { createWorld, type World } from "../helpers/run-fixture.ts";

/**
 * The queue watch (queue/queue-watch.ts, called from the controllers' reconcile): a queue paused
 * or obliterated behind rlq's back, with BullMQ's own Queue from the test, is seen, reported in
 * `rlq run status` (the report and its text) and repaired, and the run completes by itself.
 * Each change lands after the run's first train step: the rest of the run needs new rollout jobs,
 * so it completes only if rlq resumes the queue and adds the lost jobs back. The dashboard shows
 * a paused queue in a banner (headless Chromium), and tells an operator's pause made in Bull Board
 * with the token, which the watch leaves paused, from one made behind rlq's back.
 */
const TOKEN = "queue-watch-test-token-0123456789";
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
    // Rollout jobs run one at a time in a worker of their own, so a step's jobs wait in the queue
    // (4 groups a step) long enough to be seen there: with the 64 slots of `rlq up`'s worker a job
    // waits only for the instant before it is picked up.
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done", "--workers", "reward,train,eval"], w.env);
    const rolloutWorker = spawnRlq(["worker", "rollout", "--concurrency", "1"], w.env);
    procs.push(up, rolloutWorker);
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
    rolloutWorker.kill("SIGTERM");
    await rolloutWorker.exited;
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
        await waitFor("rollout jobs waiting", async () => ((await rollout.getJobCounts("waiting")).waiting ?? 0) > 0, 60_000, 20);
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

  it("the dashboard's banner shows a paused queue, and an operator's pause in Bull Board is left paused", async () => {
    const browserCheck = await ensureChromium();
    if (browserCheck.path === null) throw new Error(`the banner test needs Chromium: ${browserCheck.reason ?? "apt-get install -y chromium"}`);
    const readerDb = createDb(w.env.DATABASE_URL as string, { max: 2 });
    const dashboard = await startDashboard({ db: w.db, readerDb, queues, backend, contexts: createRunContextCache(w.db), port: 0, token: TOKEN });
    const browser = await chromium.launch({ executablePath: browserCheck.path, headless: true, args: chromiumArgs });
    const train = new backend.Queue("rlq-train", { connection: backend.connection, ...backend.baseOptions });
    try {
      // Behind rlq's back, with no controller running to resume it.
      await train.pause();
      const watchApi = async () =>
        ((await (await fetch(`${dashboard.url}/queues/api/rlq-watch`)).json()) as { queueWatch: { pausedNow: Array<{ queue: string; byOperator: boolean }> } })
          .queueWatch;
      expect((await watchApi()).pausedNow).toEqual([{ queue: "rlq-train", byOperator: false }]);
      const page = await browser.newPage();
      await page.goto(dashboard.url);
      await page.waitForSelector("#queue-banner[data-paused='rlq-train']", { state: "visible" });
      expect(await page.textContent("#queue-banner")).toContain("rlq-train is paused, not by rlq");

      // An operator's pause through Bull Board with the token: recorded, flagged, and not resumed by the watch.
      const board = (action: string) =>
        fetch(`${dashboard.url}/queues/api/queues/rlq-train/${action}`, { method: "PUT", headers: { authorization: `Bearer ${TOKEN}` } });
      expect((await board("resume")).status).toBe(200);
      expect((await board("pause")).status).toBe(200);
      await waitFor("the operator's pause to be recorded", async () => (await watchApi()).pausedNow[0]?.byOperator === true, 30_000, 100);
      await queues.watch.check({ warn: () => undefined });
      expect(await train.isPaused()).toBe(true);
      await page.locator("#queue-banner", { hasText: "rlq-train is paused by an operator" }).waitFor({ timeout: 30_000 });
      expect((await board("resume")).status).toBe(200);
      await page.waitForSelector("#queue-banner[data-paused='']", { state: "attached" });
    } finally {
      await train.close();
      await browser.close();
      await dashboard.close();
      await readerDb.close();
    }
  });
});
