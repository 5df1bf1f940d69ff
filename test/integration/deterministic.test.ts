import { sglangArgs } from "../fakes/fake-engine-control.ts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { spawnFake, spawnRlq, waitFor, type Proc } from "../helpers/processes.ts";
import { mulberry32 } from "../../src/core/random.ts";

/**
 * Deterministic mode: seeds per draw ordinal, sample and segment; every
 * dispatched group runs to completion; the kept set is the first
 * rollout_batch_size passing groups by draw ordinal. A run killed and
 * restarted many times leaves facts equal, row for row, to an uninterrupted
 * run with the same seed.
 */
const tables: Record<string, { order: string; drop: string[] }> = {
  decisions: { order: "seq", drop: ["created_at", "lease_epoch"] },
  drawn_prompts: { order: "draw_ordinal", drop: [] },
  sample_segments: { order: "group_id, sample_index, segment_index", drop: ["created_at"] },
  group_rounds: { order: "group_id, round", drop: ["created_at"] },
  sample_rewards: { order: "group_id, sample_index, round", drop: ["created_at"] },
  train_steps: { order: "step", drop: ["committed_at", "attempt", "checkpoint_uri"] },
  train_metrics: { order: "step, key", drop: [] },
  rollout_history: { order: "group_id, sample_index", drop: [] },
};

async function snapshot(w: World, runId: string): Promise<Record<string, unknown[]>> {
  const out: Record<string, unknown[]> = {};
  for (const [t, { order, drop }] of Object.entries(tables)) {
    const rows = (await w.db.pool.query(`SELECT * FROM ${t} WHERE run_id = $1 ORDER BY ${order}`, [runId])).rows;
    out[t] = rows.map((r) => {
      for (const d of [...drop, "run_id"]) delete r[d];
      // Ids and checkpoint paths embed the run id and attempt; the content is what must match.
      return JSON.parse(
        JSON.stringify(r)
          .replaceAll(runId, "RUN")
          .replace(/attempt-[0-9a-z-]+/g, "attempt-X")
          .replace(/"engine":"[^"]*"/g, '"engine":"E"')
          .replace(/http:\/\/127\.0\.0\.1:\d+/g, "URL"),
      );
    });
  }
  return out;
}

describe("deterministic mode", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("determ", { engineArgs: ["--token-delay-ms", "2"], trainerArgs: ["--step-ms", "30"] });
  });
  afterAll(async () => {
    await w?.close();
  });

  it("a run killed and restarted leaves the same facts as an uninterrupted run", async () => {
    const config = { deterministic: true, num_rollout: 6, partial_rollout: true, rollout_shuffle: true };
    const clean = await w.start(config);
    const up = spawnRlq(["up", "--run", clean, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);

    // Its own engine: the first run left the shared one serving version 6.
    const engine2 = await spawnFake("test/fakes/fake-sglang.ts", sglangArgs(["--token-delay-ms", "2"]));
    const crashed = await w.start({ ...config, engine: { kind: "sglang", urls: [engine2.url] } });
    const rand = mulberry32(99);
    const procs: { up: Proc; worker: Proc } = {
      up: spawnRlq(["up", "--run", crashed], w.env),
      worker: spawnRlq(["worker", "rollout", "reward", "train"], w.env),
    };
    let kills = 0;
    const isDone = async () => (await w.db.pool.query("SELECT status FROM runs WHERE id = $1", [crashed])).rows[0]?.status === "completed";
    while (kills < 10 && !(await isDone())) {
      await new Promise((r) => setTimeout(r, 400 + rand() * 1200));
      const which = rand() < 0.5 ? "up" : "worker";
      procs[which].kill("SIGKILL");
      await procs[which].exited;
      kills++;
      procs[which] = which === "up" ? spawnRlq(["up", "--run", crashed], w.env) : spawnRlq(["worker", "rollout", "reward", "train"], w.env);
    }
    await waitFor("the crashed run to complete", isDone, 180_000, 250);
    procs.up.kill("SIGTERM");
    procs.worker.kill("SIGTERM");
    await Promise.all([procs.up.exited, procs.worker.exited]);
    engine2.kill("SIGTERM");
    expect(kills).toBeGreaterThan(3);

    const a = await snapshot(w, clean);
    const b = await snapshot(w, crashed);
    for (const t of Object.keys(tables)) {
      const ra = a[t] ?? [];
      const rb = b[t] ?? [];
      const first = ra.findIndex((r, i) => JSON.stringify(r) !== JSON.stringify(rb[i]));
      if (first >= 0)
        console.log(
          t,
          "first difference at",
          first,
          JSON.stringify(ra.slice(Math.max(0, first - 2), first + 2)),
          "\n vs \n",
          JSON.stringify(rb.slice(Math.max(0, first - 2), first + 2)),
        );
      expect(b[t]?.length, `${t} row count`).toBe(a[t]?.length);
      expect(b[t], `${t} rows`).toEqual(a[t]);
    }
    expect(a.train_steps?.length).toBe(6);
  });
});
