import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { repoRoot } from "../helpers/processes.ts";
import { requestRunChange, runUntilDone, type RunStatusReport } from "../../src/index.ts";

/**
 * runUntilDone, the package entry's way to run a run from a script: the
 * controller and every worker in this process, as `rlq up --run ID
 * --exit-when-done`. A run stopped by the caller's signal resumes to
 * completion with a second call given its id.
 */
let w: World;
beforeAll(async () => {
  w = await createWorld("rununtildone");
});
afterAll(async () => {
  await w?.close();
});

describe("runUntilDone", () => {
  it("runs a run to completion; stopped by a signal, an API amend applies, it resumes from where it was", async () => {
    const stop = new AbortController();
    const seen: RunStatusReport[] = [];
    const first = await runUntilDone(w.baseConfig({ num_rollout: 3 }), {
      env: w.env,
      baseDir: repoRoot,
      name: "from-a-script",
      signal: stop.signal,
      progressEveryMs: 0,
      onProgress: (s) => {
        seen.push(s);
        if (s.trainSteps >= 1) stop.abort();
      },
    });
    expect(first.outcome).toBe("stopped");
    expect(first.status.status).toBe("running");
    expect(first.status.name).toBe("from-a-script");
    expect(first.status.trainSteps).toBeGreaterThanOrEqual(1);
    expect(first.status.trainSteps).toBeLessThan(3);
    expect(seen.length).toBeGreaterThan(0);

    // An amend from the API with the changed keys as they are (the CLI wraps them in {changes}).
    await requestRunChange(w.db, first.runId, "amend", { num_rollout: 4 });
    const second = await runUntilDone(null, { env: w.env, runId: first.runId });
    expect(second.runId).toBe(first.runId);
    expect(second.outcome, second.status.lastError ?? "").toBe("completed");
    expect(second.status.status).toBe("completed");
    expect(second.status.trainSteps).toBe(4);
    expect(second.status.numRollout).toBe(4);
    const steps = (await w.db.pool.query("SELECT step FROM train_steps WHERE run_id = $1 ORDER BY step", [first.runId])).rows.map((r) => r.step);
    expect(steps).toEqual([0, 1, 2, 3]);
  });

  it("refuses a call with neither a config nor a run id", async () => {
    await expect(runUntilDone(null, { env: w.env })).rejects.toThrow(/give a config, or options.runId/);
  });
});
