import { afterAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { spawnRlq, waitFor, type Proc } from "../helpers/processes.ts";
import { checkRunInvariants } from "../helpers/invariants.ts";
import { mulberry32 } from "../../src/core/random.ts";
import { createQueueBackend } from "../../src/queue/backend.ts";
import { createQueues } from "../../src/queue/queues.ts";
import { jobIds } from "../../src/queue/payloads.ts";
import { readEnv } from "../../src/config/env.ts";

/**
 * Crash anywhere: SIGKILL the controller process and a separate worker
 * process at random moments, many times over one run, restart them, and
 * lose the queue state mid-run. The run must finish with every durability
 * invariant intact. `npm test` runs a bounded version; `npm run test:chaos`
 * (RLQ_CHAOS_KILLS=40) the long one.
 */
const kills = Number(process.env.RLQ_CHAOS_KILLS ?? 20);

async function chaosRun(
  w: World,
  numRollout: number,
  killCount: number,
  seed: number,
  overrides: Record<string, unknown> = {},
): Promise<{ runId: string; killed: number; wipes: number }> {
  const runId = await w.start({ num_rollout: numRollout, partial_rollout: true, rollout_shuffle: true, over_sampling_batch_size: 6, ...overrides });
  const rand = mulberry32(seed);
  const procs: { up: Proc; worker: Proc } = {
    up: spawnRlq(["up", "--run", runId], w.env),
    worker: spawnRlq(["worker", "rollout", "reward", "train", "--concurrency", "8"], w.env),
  };
  const backend = createQueueBackend(readEnv({ ...process.env, ...w.env }), w.env.DATABASE_URL as string);
  let killed = 0;
  let wipes = 0;
  const isDone = async () => (await w.db.pool.query("SELECT count(*)::int AS n FROM train_steps WHERE run_id = $1", [runId])).rows[0].n >= numRollout;
  try {
    while (killed < killCount && !(await isDone())) {
      await new Promise((r) => setTimeout(r, 300 + rand() * 1200));
      const which = rand() < 0.5 ? "up" : "worker";
      procs[which].kill("SIGKILL");
      await procs[which].exited;
      killed++;
      if (killed % 7 === 3) {
        await backend.wipe(); // lose every queue key mid-run
        wipes++;
      }
      procs[which] = which === "up" ? spawnRlq(["up", "--run", runId], w.env) : spawnRlq(["worker", "rollout", "reward", "train", "--concurrency", "8"], w.env);
    }
    try {
      await waitFor(
        "the run to complete",
        async () => {
          const r = await w.db.pool.query("SELECT status FROM runs WHERE id = $1", [runId]);
          return r.rows[0]?.status === "completed";
        },
        150_000,
        250,
      );
    } catch (e) {
      const run = await w.db.pool.query("SELECT status, step, last_error FROM runs WHERE id = $1", [runId]);
      const last = await w.db.pool.query("SELECT seq, kind, step, group_id, payload FROM decisions WHERE run_id = $1 ORDER BY seq DESC LIMIT 6", [runId]);
      const trained = await w.db.pool.query("SELECT step, attempt, created_at FROM train_steps WHERE run_id = $1 ORDER BY step DESC LIMIT 2", [runId]);
      const step = (run.rows[0] as { step?: number } | undefined)?.step ?? 0;
      const queues = createQueues(backend);
      const jobs = { train: await queues.info("train", jobIds.train({ runId, step })), depths: await queues.depths() };
      await queues.close();
      throw new Error(
        `${(e as Error).message}\nrun: ${JSON.stringify(run.rows)}\nlast decisions: ${JSON.stringify(last.rows)}\ntrain_steps: ${JSON.stringify(trained.rows)}\n` +
          `queue: ${JSON.stringify(jobs)}\nup: ${procs.up.output().slice(-3000)}\nworker: ${procs.worker.output().slice(-3000)}`,
        { cause: e },
      );
    }
  } finally {
    procs.up.kill("SIGTERM");
    procs.worker.kill("SIGTERM");
    await Promise.all([procs.up.exited, procs.worker.exited]);
  }
  return { runId, killed, wipes };
}

/** Asynchronous mode under the same chaos: the staleness bound must hold over every trained sample. */
const asyncConfig = {
  train_async: true,
  max_staleness: 1,
  staleness_policy: "drop",
  max_regenerations: 3,
  partial_rollout: false,
  rollout_max_response_len: 32,
};

describe.each([
  ["redis", kills, 30, {}],
  ["postgres", kills, 30, {}],
  ["redis", Math.ceil(kills / 2), 16, asyncConfig],
  ["postgres", Math.ceil(kills / 4), 8, { ...asyncConfig, staleness_policy: "mask" }],
] as const)("crash anywhere, queue backend %s", (queue, killCount, numRollout, overrides) => {
  let w: World | undefined;
  afterAll(async () => {
    await w?.close();
  });

  const isAsync = "train_async" in overrides;
  it(`survives ${killCount} SIGKILLs and lost queue state with every invariant intact${isAsync ? " (async mode: the staleness bound holds)" : ""}`, async () => {
    w = await createWorld(`crash${queue}${isAsync ? "async" : ""}`, {
      queue,
      engineArgs: ["--token-delay-ms", isAsync ? "6" : "2"],
      trainerArgs: ["--step-ms", isAsync ? "150" : "40"],
    });
    const { runId, killed, wipes } = await chaosRun(w, numRollout, killCount, 1234, overrides);
    if (isAsync) {
      const worst = await w.db.pool.query("SELECT coalesce(max(staleness), 0)::int AS s, count(*)::int AS n FROM staleness WHERE run_id = $1", [runId]);
      expect(worst.rows[0]).toEqual({ s: expect.any(Number) as number, n: numRollout * 4 * 4 });
      expect(worst.rows[0].s).toBeLessThanOrEqual(1);
    }
    expect(killed).toBe(killCount); // the run outlived every kill
    expect(wipes).toBeGreaterThanOrEqual(1);
    await checkRunInvariants(w.db, runId, { numRollout, datasetSize: 64, shuffle: true, seed: 42, rbs: 4 });
    const replay = spawnRlq(["replay", runId, "--check"], w.env);
    expect(await replay.exited, replay.output()).toBe(0);

    console.log(JSON.stringify({ queue, runId, killed, wipes }));
  });
});
