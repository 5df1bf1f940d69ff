/**
 * Colocated mode (colocate: true, core/colocate.ts) end to end: `rlq up` and a worker process against
 * the fake SGLang server, which releases and resumes its memory as SGLang's scheduler does
 * (test/fakes/sglang/weights.ts cites scheduler_update_weights_mixin.py) and counts every call the
 * real one would die on. The controller is SIGKILLed once in each phase, released, training,
 * pushing and resuming, including between an endpoint call and its decision; the train worker once
 * after writing a checkpoint and before committing it. The run must complete with every durability
 * invariant, `rlq replay --check` clean, the phases in order in the log, and no generation, load
 * or resume the engine could not take.
 */
import { existsSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { keepRestarting, spawnRlq, waitFor } from "../helpers/processes.ts";
import { checkRunInvariants } from "../helpers/invariants.ts";
import { colocateCrashPoints, expectColocatedPhases } from "../helpers/colocate.ts";

describe("colocated mode", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("colocate", { engineArgs: ["--token-delay-ms", "2"], trainerArgs: ["--step-ms", "40"] });
  });
  afterAll(async () => {
    await w?.close();
  });

  it("takes turns on the shared GPUs and completes exactly with a SIGKILL in each phase", async () => {
    const numRollout = 3;
    const engineUrl = await w.freshEngine();
    const runId = await w.start({
      colocate: true,
      num_rollout: numRollout,
      partial_rollout: true,
      rollout_shuffle: true,
      engine: { kind: "sglang", urls: [engineUrl] },
    });
    const marks = colocateCrashPoints.map((_, i) => join(w.home, `colocate-crash-${i}`));
    const upEnv = { ...w.env, RLQ_CRASH_AT: colocateCrashPoints.map(([p], i) => `${p}:once=${marks[i]}`).join(",") };
    const trainMark = join(w.home, "colocate-crash-train");
    const workerEnv = { ...w.env, RLQ_CRASH_AT: `train.before_commit:once=${trainMark}` };
    const up = keepRestarting(() => spawnRlq(["up", "--run", runId], upEnv));
    const worker = keepRestarting(() => spawnRlq(["worker", "rollout", "reward", "train", "--concurrency", "8"], workerEnv));
    try {
      await waitFor(
        "the colocated run to complete",
        async () => {
          up.check();
          worker.check();
          const r = await w.db.pool.query<{ status: string; last_error: string | null }>("SELECT status, last_error FROM runs WHERE id = $1", [runId]);
          if (r.rows[0]?.status === "paused") throw new Error(`run paused: ${r.rows[0].last_error}\n${up.current().output().slice(-3000)}`);
          return r.rows[0]?.status === "completed";
        },
        180_000,
        250,
      );
    } finally {
      up.current().kill("SIGTERM");
      worker.current().kill("SIGTERM");
      await Promise.all([up.current().exited, worker.current().exited]);
    }
    // Every crash point was reached and killed its process once.
    colocateCrashPoints.forEach(([point], i) => expect(existsSync(marks[i] as string), point).toBe(true));
    expect(existsSync(trainMark)).toBe(true);
    expect(up.restarts()).toBe(colocateCrashPoints.length);
    expect(worker.restarts()).toBe(1);

    await checkRunInvariants(w.db, runId, { numRollout, datasetSize: 64, shuffle: true, seed: 42, rbs: 4 });
    const replay = spawnRlq(["replay", runId, "--check"], w.env);
    expect(await replay.exited, replay.output()).toBe(0);

    await expectColocatedPhases(w.db, runId, numRollout);

    // The engine was asked for nothing it could not take: no generation (a rollout's, a worker's
    // log-prob probe, a /health_generate) or load while released, no release while requests ran,
    // no resume of memory it held. The workers' pools check only in the engines' turn, and the
    // controller's release waits for their checks under way (store/colocate-turn.ts).
    const stats = (await (await fetch(`${engineUrl}/stats`)).json()) as {
      releases: number;
      resumes: number;
      memoryFaults: string[];
      generateWhileReleasedRids: string[];
      healthWhileReleased: number;
      loadWhileReleased: number;
    };
    expect(stats.memoryFaults).toEqual([]);
    expect({ generates: stats.generateWhileReleasedRids, health: stats.healthWhileReleased, loads: stats.loadWhileReleased }).toEqual({
      generates: [],
      health: 0,
      loads: 0,
    });
    // One release per step, plus the one re-sent by the controller killed before recording it, plus
    // one before each first resume of a restarted controller (controller/engine-admin.ts).
    expect(stats.releases).toBeGreaterThanOrEqual(numRollout + 1);
    expect(stats.resumes).toBe(2 * numRollout + 1);
  });
});
