import { afterAll, describe, expect, it } from "vitest";
import { Redis } from "ioredis";
import { createQueueBackend } from "../../src/queue/backend.ts";
import { createQueues, queueName } from "../../src/queue/queues.ts";
import { readEnv } from "../../src/config/env.ts";
import { reconcileAction } from "../../src/controller/controller.ts";
import { createTestDatabase, redisUrl } from "../helpers/services.ts";

/**
 * A partial loss of the queue state (keys lost in a failover, or a flush that
 * is not atomic, as the crash test's is) can leave a job's record without its
 * list entry. BullMQ reports such a job as "unknown" and ignores an add of its
 * id, so the job would never run again; reconcile must remove and add it.
 */
describe("a job record in no queue list (Redis)", () => {
  const prefix = `torphan${Date.now().toString(36)}`;
  const redis = new Redis(redisUrl, { maxRetriesPerRequest: 1 });
  let drop: () => Promise<void> = async () => undefined;
  afterAll(async () => {
    redis.disconnect();
    await drop();
  });

  it("is reported as unknown, ignored by a plain add, and runnable again after reconcile's replace", async () => {
    const database = await createTestDatabase("rlq_orphans");
    drop = () => database.drop();
    const env = readEnv({ ...process.env, DATABASE_URL: database.url, REDIS_URL: redisUrl, RLQ_QUEUE_PREFIX: prefix });
    const queues = createQueues(createQueueBackend(env, database.url));
    try {
      const data = { runId: "orphan", step: 3 };
      const id = await queues.enqueue("train", data);
      expect((await queues.info("train", id)).state).toBe("waiting");
      // Lose the list entry, keep the record.
      const waitKey = `${prefix}:${queueName("train")}:wait`;
      expect(await redis.lrem(waitKey, 0, id)).toBe(1);
      const lost = await queues.info("train", id);
      expect(lost.state).toBe("unknown");
      // A plain add of the same id does not bring it back.
      await queues.enqueue("train", data);
      expect((await queues.info("train", id)).state).toBe("unknown");
      // What reconcile does.
      expect(reconcileAction("train", lost, false)).toBe("replace");
      await queues.remove("train", id);
      await queues.enqueue("train", data);
      expect((await queues.info("train", id)).state).toBe("waiting");
    } finally {
      await queues.close();
      await queues.backend.wipe();
    }
  });
});
