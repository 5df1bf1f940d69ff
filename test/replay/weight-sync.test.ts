import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { parseDecision, type LoggedDecision } from "../../src/core/decisions.ts";
import { fold, apply, emptyState } from "../../src/core/run-state.ts";
import {
  abortingSyncTarget,
  foldRunSync,
  initialRouter,
  isAdmitting,
  nextRouterMode,
  runServingVersion,
  type RouterMode,
  type RunSyncMode,
} from "../../src/core/weight-sync.ts";

/**
 * The weight sync's state machine (src/core/weight-sync.ts) over the recorded decision logs
 * (scripts/record-decision-logs.ts, test/fixtures/decision-logs/): the run's sync modes are made
 * again from each log, agree with the run state's fold at every decision, and a rollout worker's
 * router fed the same log (a hint per weights decision, a job per dispatch) holds exactly while an
 * abort-mode sync is in progress and never routes a job back to an older version.
 */
const dir = join(import.meta.dirname, "../fixtures/decision-logs");
const names = readdirSync(dir)
  .filter((f) => f.endsWith(".json"))
  .map((f) => f.slice(0, -".json".length));

function recorded(name: string): LoggedDecision[] {
  const rows = JSON.parse(readFileSync(join(dir, `${name}.json`), "utf8")) as Array<{ seq: number; kind: string; payload: unknown }>;
  return rows.map((r) => parseDecision(r.kind, r.payload, r.seq));
}

describe.each(names)("weight sync replayed from the recorded log %s", (name) => {
  const log = recorded(name);

  it("re-makes one transition per weights decision, each the one recorded", () => {
    const { mode, transitions } = foldRunSync(log);
    const weights = log.filter((d) => d.kind === "weights.syncing" || d.kind === "weights.synced");
    // A log that ends (paused for a fault) before its first step trained has no weights to sync.
    expect(weights.length > 0, "weights decisions iff a step was trained").toBe(log.some((d) => d.kind === "step.trained"));
    expect(transitions.map((t) => t.seq)).toEqual(weights.map((d) => d.seq));
    for (const [i, d] of weights.entries()) {
      const t = transitions[i]?.mode as RunSyncMode;
      if (d.kind === "weights.syncing") expect(t).toMatchObject({ kind: "syncing", to: d.payload.weightVersion, strategy: d.payload.mode });
      if (d.kind === "weights.synced") expect(t).toEqual({ kind: "synced", version: d.payload.weightVersion, checkpointUri: d.payload.checkpointUri });
    }
    expect(mode).toMatchObject({ kind: "synced", version: fold("r", log).weightVersion });
  });

  it("agrees with the run state's fold after every decision", () => {
    const state = emptyState("r");
    for (const [i, d] of log.entries()) {
      apply(state, d);
      const { mode } = foldRunSync(log.slice(0, i + 1));
      expect(runServingVersion(mode)).toBe(state.weightVersion);
      expect(mode.kind === "syncing" ? { step: mode.step, weightVersion: mode.to } : null).toEqual(state.syncing);
    }
  });

  it("a router fed the log holds only during an abort-mode sync and never routes back", () => {
    let router: RouterMode = initialRouter;
    let highest = -1;
    for (const [i, d] of log.entries()) {
      const { mode } = foldRunSync(log.slice(0, i + 1));
      if (d.kind === "weights.syncing" || d.kind === "weights.synced") {
        // The one hint: the worker holds at once (an unknown target), then reads the log.
        if (router.kind === "open") router = nextRouterMode(router, { kind: "hold", until: Number.MAX_SAFE_INTEGER });
        router = nextRouterMode(router, { kind: "logRead", target: abortingSyncTarget(mode), version: runServingVersion(mode) });
        expect(isAdmitting(router)).toBe(abortingSyncTarget(mode) === null || (router.version ?? -1) >= (abortingSyncTarget(mode) ?? 0));
      }
      if (d.kind === "group.dispatched") {
        router = nextRouterMode(router, { kind: "pinned", version: d.payload.weightVersion });
        expect(router.version).toBeGreaterThanOrEqual(d.payload.weightVersion);
      }
      if (router.version !== null) {
        expect(router.version).toBeGreaterThanOrEqual(highest);
        highest = router.version;
      }
    }
    // A log that paused before its first dispatch never pinned the router.
    const isPinned = log.some((d) => d.kind === "group.dispatched");
    expect(router).toEqual(isPinned ? { kind: "open", version: fold("r", log).weightVersion, isPinned } : initialRouter);
  });
});
