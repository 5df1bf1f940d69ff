import { createServer } from "node:net";
import pg from "pg";
import { afterAll, describe, expect, it } from "vitest";
import { readEnv } from "../../src/config/env.ts";
import { isBug } from "../../src/lib/errors.ts";
import { createQueueBackend, type QueueBackend } from "../../src/queue/backend.ts";
import { UNRECOVERABLE_PREFIX } from "../../src/queue/payloads.ts";
import { queueName } from "../../src/queue/queues.ts";
import { createQueues } from "../../src/queue/queues.ts";
import { startWorker } from "../../src/queue/worker-host.ts";
import { createTestDatabase, redisUrl } from "../helpers/services.ts";
import { waitFor } from "../helpers/processes.ts";

/**
 * @file At the processor edge (queue/worker-host.ts), an error that is not an RlqError is a bug:
 * a TypeError thrown inside a job is not retried as if it were an infrastructure fault; the job
 * fails for good on its first attempt, the reason the run would pause with names the TypeError,
 * and its stack is in the job's record (BullMQ's stacktrace) and handed to the caller's log.
 * Postgres out of reach is still waited out inside the same attempt (lib/infra-outage.ts): a real
 * pg connection refused on a port nothing listens on, then the same job succeeds.
 */

/** A port nothing listens on (it did a moment ago). */
async function closedPort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  const { port } = s.address() as { port: number };
  await new Promise((r) => s.close(r));
  return port;
}

/** The failing processor, named so that its frame is findable in the recorded stack. */
function brokenScoring(data: { groupId: number }): never {
  const group = (data as unknown as { missing?: { samples: number[] } }).missing;
  // The kind of mistake a bug makes: reading a field of undefined.
  throw new TypeError(`Cannot read properties of undefined (reading 'samples') in group ${data.groupId}: ${String(group?.samples)}`);
}

describe("a job's failure that is a bug, and one that is an outage", () => {
  const prefix = `tbug${Date.now().toString(36)}`;
  let drop: () => Promise<void> = async () => undefined;
  afterAll(async () => drop());

  for (const backendKind of ["redis", "postgres"] as const) {
    it(`${backendKind}: a TypeError fails its job on the first of 3 attempts, with its name in the reason and its stack recorded and logged; an outage is waited out`, async () => {
      const database = await createTestDatabase(`rlq_bug_${backendKind}`);
      const previousDrop = drop;
      drop = async () => {
        await previousDrop();
        await database.drop();
      };
      const env = readEnv({
        ...process.env,
        DATABASE_URL: database.url,
        ...(backendKind === "redis" ? { REDIS_URL: redisUrl } : { REDIS_URL: "" }),
        RLQ_QUEUE_PREFIX: `${prefix}${backendKind}`,
      });
      const backend: QueueBackend = createQueueBackend(env, database.url);
      expect(backend.kind).toBe(backendKind);
      const queues = createQueues(backend);
      const told: Array<{ jobId: string | undefined; error: unknown }> = [];
      const outageWaits: number[] = [];
      const calls = new Map<number, number[]>();
      const deadPort = await closedPort();
      const handle = startWorker(
        backend,
        "reward",
        async (data, job) => {
          calls.set(data.groupId, [...(calls.get(data.groupId) ?? []), job.attemptsMade]);
          if (data.groupId === 1) brokenScoring(data);
          if (data.groupId === 2 && (calls.get(2) ?? []).length === 1) {
            // Postgres out of reach, as pg reports it: a real connect to a port nothing listens on
            // (a connect that fails leaves no socket to end).
            await new pg.Client({ host: "127.0.0.1", port: deadPort, user: "postgres", connectionTimeoutMillis: 5000 }).connect();
          }
        },
        {
          concurrency: 2,
          onError: (error, jobId) => told.push({ jobId, error }),
          outageTimeoutMs: 60_000,
          onOutageWait: (w) => outageWaits.push(w.waitedMs),
        },
      );
      const inspect = new backend.Queue(queueName("reward"), { connection: backend.connection, ...backend.baseOptions });
      try {
        const [bugId, outageId] = await queues.enqueueMany(
          "reward",
          [1, 2].map((groupId) => ({ runId: "bug", groupId, round: 0, step: 0 })),
          { attempts: 3 },
        );
        await waitFor("the bug's job failed and the outage's job completed", async () => {
          const [a, b] = await Promise.all([queues.info("reward", bugId as string), queues.info("reward", outageId as string)]);
          // A completed reward job is removed from the queue (queue/queues.ts removeOnComplete): "missing" once it ran twice.
          return a.state === "failed" && (calls.get(2) ?? []).length === 2 && (b.state === "completed" || b.state === "missing");
        });

        // The bug: one call, failed for good (no retry left to spend), the reason names it.
        expect(calls.get(1)).toEqual([0]);
        const info = await queues.info("reward", bugId as string);
        expect(info.attemptsMade).toBe(1);
        expect(info.failedReason?.startsWith(UNRECOVERABLE_PREFIX)).toBe(true);
        expect(info.failedReason).toMatch(/TypeError, not an RlqError\): Cannot read properties of undefined \(reading 'samples'\) in group 1/);
        // Its stack, down to the processor's frame, is in the job's record.
        const job = await inspect.getJob(bugId as string);
        expect((job?.stacktrace ?? []).join("\n")).toMatch(/caused by TypeError: Cannot read properties[\s\S]*brokenScoring/);
        // And the caller's log gets the error itself (jobs/workers.ts logs it with its stack as a bug).
        const bugTold = told.filter((t) => t.jobId === bugId);
        expect(bugTold).toHaveLength(1);
        expect(isBug(bugTold[0]?.error)).toBe(true);
        expect((bugTold[0]?.error as Error).stack).toMatch(/brokenScoring/);

        // The outage: waited out inside attempt 0, never told as a job failure.
        expect(calls.get(2)).toEqual([0, 0]);
        expect(outageWaits.length).toBeGreaterThanOrEqual(1);
        expect(told.filter((t) => t.jobId === outageId)).toEqual([]);
      } finally {
        await inspect.close();
        await handle.close();
        await queues.close();
        await backend.wipe();
      }
    });
  }
});
