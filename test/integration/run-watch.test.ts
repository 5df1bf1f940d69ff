import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { repoRoot } from "../helpers/processes.ts";
import { changeOutcome, requestRunChange, runUntilDone, startRun, waitForChange, watchRun, type RunProgress } from "../../src/index.ts";
import { insertRunRequest } from "../../src/store/run-requests.ts";

/**
 * The package entry's way to follow and steer a run from a script: watchRun
 * yields progress as the run's facts change, requestRunChange checks an amend
 * as the CLI does before recording it, and changeOutcome / waitForChange read
 * whether the controller applied or refused each request.
 */
let w: World;
beforeAll(async () => {
  w = await createWorld("runwatch");
});
afterAll(async () => {
  await w?.close();
});

describe("watchRun, requestRunChange and waitForChange", () => {
  it("refuses a bad amend before recording it, naming the key and what to write", async () => {
    const { runId } = await startRun(w.db, { config: w.baseConfig({ num_rollout: 1 }), baseDir: repoRoot });
    await expect(requestRunChange(w.db, runId, "amend", { lr: 0.5 })).rejects.toThrow(
      /amend of run r\w+: keys lr cannot be amended on a live run \(allowed: num_rollout \(extends or shortens the run/,
    );
    await expect(requestRunChange(w.db, runId, "amend", { max_attempts: 5 })).rejects.toThrow(/'max_attempts' renamed to 'train_max_attempts'/);
    await expect(requestRunChange(w.db, runId, "amend", { num_rollout: "ten" })).rejects.toThrow(/amend of run r\w+: num_rollout = "ten": /);
    await expect(requestRunChange(w.db, runId, "amend", {})).rejects.toThrow(
      /no keys to change; write the keys and their new values, e.g. \{num_rollout: 10\}/,
    );
    await expect(requestRunChange(w.db, runId, "amend", { changes: { eval_interval: -3 } })).rejects.toThrow(/eval_interval = -3/);
    const recorded = (await w.db.pool.query("SELECT count(*)::int AS n FROM run_requests WHERE run_id = $1", [runId])).rows[0].n;
    expect(recorded).toBe(0);
    await expect(changeOutcome(w.db, 987654321)).rejects.toMatchObject({ code: "run_request_not_found" });
  });

  it("watches a run paused, amended and resumed by requests whose outcomes it reads, to completion", async () => {
    const { runId } = await startRun(w.db, { config: w.baseConfig({ num_rollout: 2 }), baseDir: repoRoot });
    // Recorded before any controller runs: the controller handles them first, in order.
    const pause = await requestRunChange(w.db, runId, "pause");
    const amend = await requestRunChange(w.db, runId, "amend", { num_rollout: 3 });
    // A request written past the API's check (as an older client might): the controller refuses it.
    const bad = await insertRunRequest(w.db, runId, "amend", { changes: { lr: 0.5 } });
    expect(await changeOutcome(w.db, pause)).toEqual({ id: pause, runId, kind: "pause", state: "pending" });

    const driving = runUntilDone(null, { env: w.env, runId });
    const seen: RunProgress[] = [];
    let resume: number | null = null;
    for await (const p of watchRun(w.db, runId, { pollMs: 200 })) {
      seen.push(p);
      // Resumed once the watch shows the run paused by the operator with the amend applied.
      if (resume === null && p.status === "paused" && p.numRollout === 3) {
        expect(p.lastError).toBe("paused by operator");
        expect(p.trainSteps).toBe(0);
        resume = await requestRunChange(w.db, runId, "resume");
      }
    }
    const done = await driving;
    expect(done.outcome, done.status.lastError ?? "").toBe("completed");

    expect(resume).not.toBeNull();
    expect(await waitForChange(w.db, pause)).toMatchObject({ state: "applied", kind: "pause" });
    expect(await waitForChange(w.db, amend)).toMatchObject({ state: "applied", kind: "amend" });
    expect(await waitForChange(w.db, resume as number)).toMatchObject({ state: "applied", kind: "resume" });
    const refused = await waitForChange(w.db, bad);
    expect(refused).toMatchObject({ state: "refused", kind: "amend" });
    expect(refused.state === "refused" && refused.reason).toMatch(/keys lr cannot be amended on a live run/);

    // The watch: paused before any step, then every value a change, steps never going back, ending completed.
    const last = seen.at(-1);
    expect(last).toMatchObject({ runId, status: "completed", trainSteps: 3, numRollout: 3 });
    expect(seen.findIndex((p) => p.status === "paused")).toBeLessThan(seen.findIndex((p) => p.trainSteps > 0));
    for (let i = 1; i < seen.length; i++) {
      const [a, b] = [seen[i - 1] as RunProgress, seen[i] as RunProgress];
      expect(b.trainSteps).toBeGreaterThanOrEqual(a.trainSteps);
      expect(b.seq).toBeGreaterThanOrEqual(a.seq);
      expect([a.status, a.trainSteps, a.weightVersion, a.lastError, a.numRollout]).not.toEqual([
        b.status,
        b.trainSteps,
        b.weightVersion,
        b.lastError,
        b.numRollout,
      ]);
    }
    // A step's commit shows as its own value (the weights it produced arrive with it or after it).
    expect(new Set(seen.map((p) => p.trainSteps))).toEqual(new Set([0, 1, 2, 3]));
  });
});
