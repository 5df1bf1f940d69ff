import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFaultWorld, planOutages, runWithOutages, seededRandom, type FaultWorld, type Service } from "../helpers/fault-schedule.ts";
import { ownServicesAvailable } from "../helpers/own-services.ts";

/**
 * The short form of scripts/fault-outages.ts, so that each CI run meets a schedule no one chose:
 * one run (sync or async, Redis or BullMQ's Postgres backend) with two or three outages of 5 to
 * 12 s (log-uniform) aimed at random phases (a train step, a weight sync, the seal, an eval, the
 * controller's commits). The seed is the date's (one schedule a day, the same on every machine)
 * unless RLQ_FAULT_SEED names one; it is printed, and a failure names it, so a failing schedule
 * replays. The run must complete by itself, exactly, with no pause.
 */
const skip = ownServicesAvailable();
if (skip) console.warn(`fault-outages-short.test.ts SKIPPED: ${skip}`);

const seed = process.env.RLQ_FAULT_SEED ? Number(process.env.RLQ_FAULT_SEED) : Number(new Date().toISOString().slice(0, 10).replaceAll("-", ""));

describe.skipIf(skip !== null)("a short random outage schedule", () => {
  let dir: string;
  let w: FaultWorld;
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "rlq-fault-short-"));
    w = await createFaultWorld(dir, { trainerStepMs: 1000, loadDelayMs: 1000 });
  });
  afterAll(async () => {
    await w?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it(`completes exactly with no pause through 2-3 random outages (seed ${seed}; replay with RLQ_FAULT_SEED=${seed})`, async () => {
    console.log(`fault-outages-short: seed ${seed} (RLQ_FAULT_SEED=${seed} replays it)`);
    const rand = seededRandom(seed);
    const queue = rand() < 0.5 ? "redis" : "postgres";
    const mode = rand() < 0.5 ? "sync" : "async";
    const services: Service[] = queue === "redis" ? ["postgres", "redis"] : ["postgres"];
    const plan = planOutages(rand, rand() < 0.5 ? 2 : 3, services, { minMs: 5000, maxMs: 12_000, longShare: 0, longMinMs: 0, longMaxMs: 0 });
    const spec = { name: `short${seed}`, mode, queue, numRollout: 5, outageTimeoutS: 120 } as const;
    const r = await runWithOutages(w, spec, plan, (line) => console.log(line));
    const context = `seed ${seed}: ${JSON.stringify({ ...r, upOutputTail: undefined }, null, 1)}\n--- rlq up ---\n${r.upOutputTail}`;
    for (const o of r.outages) expect(["ridden out", "phase not reached before the run ended"], context).toContain(o.outcome);
    expect(r.upExits, context).toEqual([0]);
    expect(r.exactnessError, context).toBeNull();
    expect(r.exact, context).toBe(true);
    expect(r.paused, context).toEqual([]);
    expect(r.replayExit, context).toBe(0);
  });
});
