/**
 * Colocated mode, a rollout worker's engine pool (runtime/engines.ts) against the controller's
 * release (store/colocate-turn.ts): the worker's pool admits an engine (its log-prob probe, three
 * slow generations) just before the controller releases the engine's memory. The release waits
 * for the probe; once the log says the step is sealed or the engines released, the worker's pool
 * sends the engine nothing (no /health_generate, no probe) until the log says they are resident
 * again. A hold whose process dies (its connection ends) lets the release go.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { waitFor } from "../helpers/processes.ts";
import { fakeStats, type FakeSglangStats } from "../fakes/fake-engine-control.ts";
import { appendDecisions } from "../../src/store/decision-log.ts";
import { createRunContextCache } from "../../src/runtime/run-context.ts";
import { createEngineProvider } from "../../src/runtime/engines.ts";
import { enterEnginesTurn, holdForRelease, loadColocateTurn } from "../../src/store/colocate-turn.ts";
import type { EnginePool } from "../../src/engines/pool.ts";
import type { Decision } from "../../src/core/decisions.ts";

const memory = (url: string, action: "release" | "resume", tags: string[]) =>
  fetch(`${url}/${action}_memory_occupation`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ tags }) });

/** What the engine must never have seen: a call the real scheduler dies on, a generation or health check while released. */
const faults = (s: FakeSglangStats) => ({ memory: s.memoryFaults, generates: s.generateWhileReleasedRids, health: s.healthWhileReleased });
const none = { memory: [], generates: [], health: 0 };

describe("colocated mode: a rollout worker's engine pool", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("colocwp");
  });
  afterAll(async () => {
    await w?.close();
  });

  /** A colocated run on a fresh engine, and the decisions the controller appends to its log (after run.created and run.status). */
  async function colocatedRun(engineArgs: string[] = []) {
    const url = await w.freshEngine(engineArgs);
    const runId = await w.start({ colocate: true, engine: { kind: "sglang", urls: [url] }, rollout_health_check_first_wait: 0 });
    let seq = 2;
    const commit = async (d: Decision) => {
      await appendDecisions(w.db, runId, 0, seq, [d]);
      seq++;
    };
    const ctx = await createRunContextCache(w.db).get(runId);
    return { url, runId, ctx, commit };
  }

  it("an admission under way when the controller releases: the release waits for its probe, and nothing reaches the engine until it is resident again", async () => {
    // Slow tokens: the probe's generations are still running when the controller releases.
    const { url, runId, ctx, commit } = await colocatedRun(["--token-delay-ms", "300"]);
    const provider = createEngineProvider(w.db, null);
    try {
      // A job at version 0 made this worker's pool; its first health round admits the engine.
      const pool = (await provider.engineFor(ctx, 0)) as EnginePool;
      await waitFor("the admission's probe generating", async () => (await fakeStats(url)).live > 0, 10_000, 5);

      // The controller: the step sealed, then the release (sync-step.ts `tickColocated`).
      await commit({ kind: "step.sealed", payload: { step: 0, kept: [], aborted: [] } });
      expect(await loadColocateTurn(w.db.pool, runId)).toBe("release_due");
      const released = await holdForRelease(w.db, runId, () => memory(url, "release", ["weights", "kv_cache"]));
      expect(released.ok, await released.text()).toBe(true);
      await commit({ kind: "engines.released", payload: { step: 0 } });
      await waitFor("the admission ended", () => pool.engineStates()[url] === "healthy");
      const atRelease = await fakeStats(url);
      expect(faults(atRelease)).toEqual(none);

      // Released: the worker's health rounds send nothing.
      await pool.checkHealth();
      await pool.checkHealth();
      expect((await fakeStats(url)).healthChecks).toBe(atRelease.healthChecks);

      // Weights back, not the KV cache: still nothing. Then resident: the checks go out again.
      expect((await memory(url, "resume", ["weights"])).ok).toBe(true);
      await commit({ kind: "engines.resumed", payload: { step: 0, tag: "weights" } });
      await pool.checkHealth();
      expect((await fakeStats(url)).healthChecks).toBe(atRelease.healthChecks);
      expect((await memory(url, "resume", ["kv_cache"])).ok).toBe(true);
      await commit({ kind: "engines.resumed", payload: { step: 0, tag: "kv_cache" } });
      expect(await loadColocateTurn(w.db.pool, runId)).toBe("engines");
      await pool.checkHealth();
      const after = await fakeStats(url);
      expect(after.healthChecks).toBeGreaterThan(atRelease.healthChecks);
      expect(faults(after)).toEqual(none);
    } finally {
      await provider.close();
    }
  });

  it("a worker whose pool starts after the step is sealed sends the engine nothing, not even its first check", async () => {
    const { url, ctx, commit } = await colocatedRun();
    await commit({ kind: "step.sealed", payload: { step: 0, kept: [], aborted: [] } });
    const provider = createEngineProvider(w.db, null);
    try {
      const pool = (await provider.engineFor(ctx, 0)) as EnginePool;
      await pool.checkHealth();
      const s = await fakeStats(url);
      expect([s.healthChecks, s.generate]).toEqual([0, 0]);
      expect(pool.engineStates()[url]).toBe("starting");
    } finally {
      await provider.close();
    }
  });

  it("the release waits for a worker's hold, and goes once the worker's connection ends (a killed worker)", async () => {
    const { url, runId, commit } = await colocatedRun();
    const hold = await enterEnginesTurn(w.db, runId);
    expect(hold).not.toBeNull();
    await commit({ kind: "step.sealed", payload: { step: 0, kept: [], aborted: [] } });
    // Sealed: a second worker finds the step sealed (or the release under way) and gets no hold.
    expect(await enterEnginesTurn(w.db, runId)).toBeNull();
    let isReleased = false;
    const releasing = holdForRelease(w.db, runId, async () => {
      isReleased = true;
      return memory(url, "release", ["weights", "kv_cache"]);
    });
    const waiting = async () =>
      (
        await w.db.pool.query<{ n: number }>(
          "SELECT count(*)::int AS n FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND NOT l.granted AND a.application_name = $1",
          [`rlq-colocate-${runId}`],
        )
      ).rows[0]?.n;
    await waitFor("the release waiting for the worker's hold", async () => (await waiting()) === 1);
    expect(isReleased).toBe(false);
    // The worker dies: its backend ends, and the hold with it.
    await w.db.pool.query(
      `SELECT pg_terminate_backend(l.pid) FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ShareLock' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
    );
    expect((await releasing).ok).toBe(true);
    expect(isReleased).toBe(true);
    // Nothing lost: the dead hold's connection is gone; leaving it again is a no-op for the pool.
    await hold?.leave();
  });
});
