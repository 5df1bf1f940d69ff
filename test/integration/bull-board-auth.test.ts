import { appRoutes } from "@bull-board/api/dist/routes.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readEnv } from "../../src/config/env.ts";
import { startDashboard, type DashboardHandle } from "../../src/dashboard/server.ts";
import { createQueueBackend, type QueueBackend } from "../../src/queue/backend.ts";
import { queueKinds } from "../../src/queue/payloads.ts";
import { createQueues, queueName, type Queues } from "../../src/queue/queues.ts";
import { createRunContextCache } from "../../src/runtime/run-context.ts";
import { createDb, type Db } from "../../src/store/db.ts";
import { waitFor } from "../helpers/processes.ts";
import { createTestDatabase, redisUrl } from "../helpers/services.ts";

/**
 * Bull Board at /queues is read-only unless a request carries the dashboard's token
 * (dashboard/bull-board.ts). Every route of @bull-board/api that is not a GET (its routes table,
 * read from the installed package, so a route a later version adds is tried too) is refused
 * without the token, and with a wrong one, and the queues read back through BullMQ are exactly as
 * before; reads answer as they do without a token. With the token, add, retry (one job and all
 * failed), remove, clean, empty, pause, resume (one queue and all) and obliterate change the
 * queues as Bull Board says they do. Both queue backends: Redis, and BullMQ's Postgres backend
 * (the demo's, with no REDIS_URL). A change made with the token is recorded for the queue watch
 * (queue/queue-watch.ts), one record per queue it touched; the refused ones record nothing.
 */
const TOKEN = "board-test-token-0123456789abcdef";

describe.each(["redis", "postgres"] as const)("Bull Board behind the dashboard token (%s queues)", (queueBackend) => {
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let db: Db;
  let readerDb: Db;
  let backend: QueueBackend;
  let queues: Queues;
  let dashboard: DashboardHandle;
  /** One BullMQ Queue per rlq queue, to seed and read back behind the board's back. */
  let q: Record<string, InstanceType<QueueBackend["Queue"]>>;

  beforeAll(async () => {
    database = await createTestDatabase("rlq_boardauth");
    const prefix = `tboardauth${queueBackend[0]}${Date.now().toString(36)}`;
    backend = createQueueBackend(
      readEnv({ DATABASE_URL: database.url, ...(queueBackend === "redis" ? { REDIS_URL: redisUrl } : {}), RLQ_QUEUE_PREFIX: prefix }),
      database.url,
    );
    queues = createQueues(backend);
    db = createDb(database.url, { max: 2 });
    readerDb = createDb(database.readerUrl, { max: 2 });
    dashboard = await startDashboard({ db, readerDb, queues, backend, contexts: createRunContextCache(db), port: 0, token: TOKEN });
    q = Object.fromEntries(queueKinds.map((k) => [queueName(k), new backend.Queue(queueName(k), { connection: backend.connection, ...backend.baseOptions })]));
  });
  afterAll(async () => {
    await dashboard?.close();
    await Promise.all(Object.values(q ?? {}).map((x) => x.obliterate({ force: true }).then(() => x.close())));
    await queues?.close();
    await backend?.wipe(); // the queue watch's record too
    await db?.close();
    await readerDb?.close();
    await database?.drop();
  });

  const board = (method: string, path: string, init: { token?: string; body?: unknown } = {}) =>
    fetch(`${dashboard.url}/queues${path}`, {
      method,
      headers: {
        ...(init.body === undefined ? {} : { "content-type": "application/json" }),
        ...(init.token === undefined ? {} : { authorization: `Bearer ${init.token}` }),
      },
      ...(init.body === undefined ? {} : { body: JSON.stringify(init.body) }),
    });

  /** Everything a mutating route could change, read back with BullMQ. */
  async function snapshot() {
    const out: Record<string, unknown> = {};
    for (const [name, x] of Object.entries(q)) {
      const jobs = await x.getJobs(["waiting", "delayed", "prioritized", "failed", "completed", "active"]);
      out[name] = {
        counts: await x.getJobCounts(),
        isPaused: await x.isPaused(),
        concurrency: await x.getGlobalConcurrency(),
        rateLimitTtl: await x.getRateLimitTtl(),
        schedulers: await x.getJobSchedulers(),
        jobs: await Promise.all(
          jobs
            .sort((a, b) => String(a.id).localeCompare(String(b.id)))
            .map(async (j) => ({ id: j.id, state: await j.getState(), data: j.data, priority: j.opts.priority ?? 0, delay: j.delay })),
        ),
      };
    }
    return out;
  }

  it("refuses every mutating route without the token, changing nothing; with it, they work", async () => {
    // Seed: waiting jobs on train, a delayed one, two failed jobs on eval, a paused reward queue.
    const train = q["rlq-train"]!;
    const evalQ = q["rlq-eval"]!;
    await train.add("w", { n: 1 }, { jobId: "w1" });
    await train.add("w", { n: 2 }, { jobId: "w2" });
    await train.add("d", { n: 3 }, { jobId: "d1", delay: 3_600_000 });
    for (const id of ["f1", "f2"]) await evalQ.add("f", { id }, { jobId: id, attempts: 1 });
    const failer = new backend.Worker(
      "rlq-eval",
      async () => {
        throw new Error("injected failure");
      },
      { connection: backend.connection, ...backend.baseOptions },
    );
    await waitFor("two failed eval jobs", async () => (await evalQ.getJobCounts("failed")).failed === 2, 30_000);
    await failer.close();
    await q["rlq-reward"]!.pause();
    const before = await snapshot();

    // Every non-GET route in @bull-board/api's table, with its parameters filled in.
    const params: Record<string, string> = { queueName: "rlq-train", queueStatus: "failed", jobId: "w1", schedulerId: "s1" };
    const bodies: Record<string, unknown> = {
      "/api/queues/:queueName/add": { name: "added", data: { n: 9 }, options: {} },
      "/api/queues/:queueName/concurrency": { concurrency: 1 },
      "/api/queues/:queueName/rate-limit": { max: 1, duration: 1000 },
      "/api/queues/:queueName/obliterate": { force: true },
      "/api/queues/:queueName/:jobId/update-data": { data: { n: 99 } },
      "/api/queues/:queueName/:jobId/delay": { delay: 60_000 },
      "/api/queues/:queueName/:jobId/priority": { priority: 5 },
      "/api/queues/:queueName/job-schedulers/:schedulerId": { pattern: "* * * * *" },
    };
    const mutating = appRoutes.api.filter((r) => r.method !== "get");
    expect(mutating.map((r) => `${r.method} ${String(r.route)}`)).toEqual(
      expect.arrayContaining([
        "post /api/queues/:queueName/add",
        "put /api/queues/:queueName/retry/:queueStatus",
        "put /api/queues/:queueName/:jobId/retry",
        "put /api/queues/:queueName/:jobId/clean",
        "put /api/queues/:queueName/clean/:queueStatus",
        "put /api/queues/:queueName/empty",
        "put /api/queues/:queueName/obliterate",
        "put /api/queues/:queueName/pause",
        "put /api/queues/:queueName/resume",
        "put /api/queues/pause",
        "put /api/queues/resume",
      ]),
    );
    for (const r of mutating) {
      const route = String(r.route);
      const path = route.replace(/:(\w+)/g, (_m, p: string) => (p === "queueName" && route.endsWith("/resume") ? "rlq-reward" : (params[p] ?? p)));
      for (const token of [undefined, "wrong-token-wrong-token-wrong-to"]) {
        const res = await board(String(r.method).toUpperCase(), path, { ...(token === undefined ? {} : { token }), body: bodies[route] ?? {} });
        expect(res.status, `${r.method} ${path} without the token`).toBe(401);
        const body = (await res.json()) as { error: { code: string; message: string } };
        expect(body.error.message).toMatch(/send the header 'Authorization: Bearer <RLQ_DASHBOARD_TOKEN>'/);
      }
    }
    expect(await snapshot()).toEqual(before);
    expect(await queues.watch.events()).toEqual([]);

    // Reads answer without the token, from the read-only board.
    const read = (await (await board("GET", "/api/queues?activeQueue=rlq-train&status=waiting")).json()) as {
      queues: Array<{ name: string; readOnlyMode: boolean; jobs: Array<{ id: string }> }>;
    };
    expect(read.queues.map((x) => x.name).sort()).toEqual(["rlq-eval", "rlq-reward", "rlq-rollout", "rlq-train"]);
    expect(read.queues.every((x) => x.readOnlyMode)).toBe(true);
    expect(
      read.queues
        .find((x) => x.name === "rlq-train")
        ?.jobs.map((j) => j.id)
        .sort(),
    ).toEqual(["w1", "w2"]);
    expect((await board("GET", "/api/queues/rlq-train/w1")).status).toBe(200);
    expect((await board("GET", "/")).status).toBe(200);
    // With the token the board is the writable one.
    const readWithToken = (await (await board("GET", "/api/queues", { token: TOKEN })).json()) as { queues: Array<{ readOnlyMode: boolean }> };
    expect(readWithToken.queues.every((x) => !x.readOnlyMode)).toBe(true);

    // With the token each route does what it says.
    const ok = async (method: string, path: string, body: unknown = {}) => {
      const res = await board(method, path, { token: TOKEN, body });
      expect(res.status, `${method} ${path}: ${await res.clone().text()}`).toBeLessThan(300);
    };
    await ok("POST", "/api/queues/rlq-train/add", { name: "added", data: { n: 9 }, options: { jobId: "a1" } });
    expect(await train.getJobState("a1")).toBe("waiting");
    await ok("PUT", "/api/queues/rlq-eval/f1/retry");
    expect(await evalQ.getJobState("f1")).toBe("waiting");
    await ok("PUT", "/api/queues/rlq-eval/retry/failed");
    expect(await evalQ.getJobState("f2")).toBe("waiting");
    await ok("PUT", "/api/queues/rlq-train/w1/clean");
    expect(await train.getJob("w1")).toBeUndefined();
    // Bull Board cleans jobs older than its 5 s grace: asked again until the waiting jobs are gone.
    await waitFor(
      "clean to remove eval's waiting jobs",
      async () => {
        await ok("PUT", "/api/queues/rlq-eval/clean/wait");
        return (await evalQ.getJobCounts("wait")).wait === 0;
      },
      30_000,
      500,
    );
    await ok("PUT", "/api/queues/rlq-train/empty");
    expect(await train.getJobCounts("wait", "delayed")).toEqual({ wait: 0, delayed: 1 }); // BullMQ drain() leaves delayed jobs
    await ok("PUT", "/api/queues/rlq-reward/resume");
    expect(await q["rlq-reward"]!.isPaused()).toBe(false);
    await ok("PUT", "/api/queues/rlq-train/pause");
    expect(await train.isPaused()).toBe(true);
    await ok("PUT", "/api/queues/rlq-train/resume");
    expect(await train.isPaused()).toBe(false);
    await ok("PUT", "/api/queues/pause");
    for (const x of Object.values(q)) expect(await x.isPaused()).toBe(true);
    await ok("PUT", "/api/queues/resume");
    for (const x of Object.values(q)) expect(await x.isPaused()).toBe(false);
    const rollout = q["rlq-rollout"]!;
    await rollout.add("r", { n: 1 }, { jobId: "r1" });
    await ok("PUT", "/api/queues/rlq-rollout/pause"); // Bull Board obliterates paused queues only
    await ok("PUT", "/api/queues/rlq-rollout/obliterate", { force: true });
    expect(await rollout.getJob("r1")).toBeUndefined();
    expect(await rollout.isPaused()).toBe(false); // its meta key went with it
    // Each change made with the token is on the queue watch's record, as the operator's.
    const isObliterate = (e: { kind: string; detail: string }) => e.kind === "operator_change" && e.detail.startsWith("PUT /api/queues/rlq-rollout/obliterate");
    const recorded = await waitFor(
      "the board's changes on the watch's record",
      async () => {
        const events = await queues.watch.events();
        return events.filter((e) => e.kind === "operator_pause").length === 6 && events.some(isObliterate) ? events : null;
      },
      30_000,
      100,
    );
    expect(recorded.every((e) => e.action === "recorded" && e.runId === null)).toBe(true);
    expect(
      recorded
        .filter((e) => e.kind === "operator_pause")
        .map((e) => e.queue)
        .sort(),
    ).toEqual(["rlq-eval", "rlq-reward", "rlq-rollout", "rlq-rollout", "rlq-train", "rlq-train"].sort());
    expect(
      recorded
        .filter((e) => e.kind === "operator_resume")
        .map((e) => e.queue)
        .sort(),
    ).toEqual(["rlq-eval", "rlq-reward", "rlq-reward", "rlq-rollout", "rlq-train", "rlq-train"].sort());
  });

  it("a dashboard started without a token refuses changes with 403 and says how to allow them", async () => {
    const readOnly = await startDashboard({ db, readerDb, queues, backend, contexts: createRunContextCache(db), port: 0 });
    try {
      const res = await fetch(`${readOnly.url}/queues/api/queues/rlq-train/pause`, { method: "PUT", headers: { authorization: `Bearer ${TOKEN}` } });
      expect(res.status).toBe(403);
      expect(((await res.json()) as { error: { message: string } }).error.message).toMatch(/RLQ_DASHBOARD_TOKEN/);
      expect(await q["rlq-train"]!.isPaused()).toBe(false);
      expect((await fetch(`${readOnly.url}/queues/api/queues`)).status).toBe(200);
    } finally {
      await readOnly.close();
    }
  });
});
