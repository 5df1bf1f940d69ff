import { afterAll, describe, expect, it } from "vitest";
import { createQueueBackend } from "../../src/queue/backend.ts";
import { createQueues } from "../../src/queue/queues.ts";
import { FETCH_LANE_CONCURRENCY, fetchLanes, startWorker } from "../../src/queue/worker-host.ts";
import { readEnv } from "../../src/config/env.ts";
import { createTestDatabase, redisUrl } from "../helpers/services.ts";
import { waitFor } from "../helpers/processes.ts";

/**
 * A worker's concurrency above FETCH_LANE_CONCURRENCY runs as several BullMQ Workers on Redis
 * (queue/worker-host.ts: one Worker fetches a whole burst before it starts the first job). The
 * lanes together must be the one worker the caller asked for: the concurrency exactly, every
 * job once.
 */
describe("fetch lanes: a large concurrency as several BullMQ Workers", () => {
  it("splits the concurrency into lanes of at most FETCH_LANE_CONCURRENCY on Redis, one Worker on Postgres", () => {
    expect(fetchLanes(648, "redis")).toEqual([...Array<number>(10).fill(59), 58]);
    expect(fetchLanes(648, "redis").reduce((a, b) => a + b, 0)).toBe(648);
    expect(Math.max(...fetchLanes(648, "redis"))).toBeLessThanOrEqual(FETCH_LANE_CONCURRENCY);
    expect(fetchLanes(64, "redis")).toEqual([64]);
    expect(fetchLanes(65, "redis")).toEqual([33, 32]);
    expect(fetchLanes(1, "redis")).toEqual([1]);
    expect(fetchLanes(648, "postgres")).toEqual([648]);
  });

  const prefix = `tlanes${Date.now().toString(36)}`;
  let drop: () => Promise<void> = async () => undefined;
  afterAll(async () => drop());

  it("runs exactly `concurrency` jobs at once across its lanes, each job once", async () => {
    const database = await createTestDatabase("rlq_lanes");
    drop = () => database.drop();
    const env = readEnv({ ...process.env, DATABASE_URL: database.url, REDIS_URL: redisUrl, RLQ_QUEUE_PREFIX: prefix });
    const backend = createQueueBackend(env, database.url);
    const queues = createQueues(backend);
    const concurrency = 150; // three lanes: 50 + 50 + 50
    const total = 400;
    let running = 0;
    let maxRunning = 0;
    const seen = new Map<number, number>();
    let release!: () => void;
    const released = new Promise<void>((r) => (release = r));
    const handle = startWorker(
      backend,
      "reward",
      async (data) => {
        seen.set(data.groupId, (seen.get(data.groupId) ?? 0) + 1);
        running++;
        maxRunning = Math.max(maxRunning, running);
        await released;
        running--;
      },
      { concurrency },
    );
    try {
      await queues.enqueueMany(
        "reward",
        Array.from({ length: total }, (_, groupId) => ({ runId: "lanes", groupId, round: 0, step: 0 })),
      );
      // The lanes fill up to the concurrency and no further: the rest wait in the queue.
      await waitFor("every slot of every lane busy", () => running === concurrency);
      const depths = await queues.depths();
      expect(depths.reward.active).toBe(concurrency);
      expect(depths.reward.waiting).toBe(total - concurrency);
      release();
      await waitFor("every job done", () => [...seen.values()].reduce((a, b) => a + b, 0) === total && running === 0);
      expect(maxRunning).toBe(concurrency);
      expect(seen.size).toBe(total);
      expect([...seen.values()].every((n) => n === 1)).toBe(true);
    } finally {
      release();
      await handle.close();
      await queues.close();
      await backend.wipe();
    }
  });
});
