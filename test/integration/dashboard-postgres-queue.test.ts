import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readEnv } from "../../src/config/env.ts";
import { createQueueBackend } from "../../src/queue/backend.ts";
import { createQueues, type Queues } from "../../src/queue/queues.ts";
import { spawnRlq, waitFor, type Proc } from "../helpers/processes.ts";
import { createTestDatabase } from "../helpers/services.ts";

/**
 * Bull Board and /metrics on BullMQ's Postgres backend (no REDIS_URL): the
 * board lists rlq's queues and their jobs and shows the Postgres server's
 * stats where Redis's INFO would be; `rlq worker` and `rlq dashboard` serve
 * Prometheus metrics with the queue depths read from that backend.
 */
describe("dashboard on BullMQ's Postgres backend", () => {
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let home: string;
  let env: Record<string, string>;
  let queues: Queues;
  const procs: Proc[] = [];

  beforeAll(async () => {
    database = await createTestDatabase("rlq_dashpg");
    home = mkdtempSync(join(tmpdir(), "rlq-dashpg-"));
    const prefix = `tdashpg${Date.now().toString(36)}`;
    env = { DATABASE_URL: database.url, RLQ_QUEUE_PREFIX: prefix, RLQ_HOME: home, RLQ_LOG_LEVEL: "warn" };
    const backend = createQueueBackend(readEnv({ DATABASE_URL: database.url, RLQ_QUEUE_PREFIX: prefix }), database.url);
    queues = createQueues(backend);
  });
  afterAll(async () => {
    for (const p of procs) p.kill("SIGKILL");
    await Promise.all(procs.map((p) => p.exited));
    await queues?.close();
    await database?.drop();
    rmSync(home, { recursive: true, force: true });
  });

  it("lists queues and jobs in Bull Board and serves /metrics from rlq dashboard and rlq worker", async () => {
    // A train job nobody consumes (no train worker here): it stays waiting for the board to show.
    await queues.enqueue("train", { runId: "rnone", step: 3 });
    const dash = spawnRlq(["dashboard", "--port", "0"], { ...env, RLQ_METRICS_PORT: "0" });
    procs.push(dash);
    const url = await waitFor("dashboard url", async () => /dashboard listening (http:\/\/\S+)/.exec(dash.output())?.[1] ?? null, 120_000);
    const board = (await (await fetch(`${url}/queues/api/queues?activeQueue=rlq-train&status=waiting`)).json()) as {
      queues: Array<{ name: string; counts: Record<string, number>; jobs: Array<{ id: string }> }>;
    };
    expect(board.queues.map((q) => q.name).sort()).toEqual(["rlq-eval", "rlq-reward", "rlq-rollout", "rlq-train"]);
    const train = board.queues.find((q) => q.name === "rlq-train");
    expect(train?.counts.waiting).toBe(1);
    expect(train?.jobs.map((j) => j.id)).toEqual(["train-rnone-3"]);
    const stats = await fetch(`${url}/queues/api/redis/stats`);
    expect(stats.status).toBe(200);
    expect(JSON.stringify(await stats.json())).toMatch(/postgres/i);

    const dashMetrics = await (await fetch(`${url}/metrics`)).text();
    expect(dashMetrics).toMatch(/^rlq_queue_jobs\{queue="train",state="waiting"\} 1$/m);

    const worker = spawnRlq(["worker", "rollout"], { ...env, RLQ_METRICS_PORT: "0" });
    procs.push(worker);
    const port = await waitFor("worker metrics port", async () => /metrics listening (\d+)/.exec(worker.output())?.[1] ?? null, 120_000);
    const scraped = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
    expect(scraped).toMatch(/^rlq_queue_jobs\{queue="train",state="waiting"\} 1$/m);
    expect(scraped).toMatch(/^# TYPE rlq_jobs_completed_total counter$/m);
    expect(scraped).toMatch(/^rlq_process_resident_memory_bytes \d+/m);
    worker.kill("SIGTERM");
    expect(await worker.exited).toBe(0);
  });
});
