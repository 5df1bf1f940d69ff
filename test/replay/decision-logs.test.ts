import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { parseDecision, type LoggedDecision } from "../../src/core/decisions.ts";
import { apply, applyDecisions, emptyState, fold, totalSteps, type RunState } from "../../src/core/run-state.ts";
import { restoreRunState, snapshotRunState } from "../../src/core/run-state-snapshot.ts";
import { parseRunConfig } from "../../src/config/run-config.ts";
import { sealDecision, shouldDrawMore } from "../../src/core/decide-groups.ts";
import { outcomeLoads, stepLoads } from "../../src/core/group-load.ts";
import { admission, isSyncDue, syncDecisions } from "../../src/core/pipeline.ts";

/**
 * The decision core over real decision logs, recorded from `rlq up` runs by
 * scripts/record-decision-logs.ts (test/fixtures/decision-logs/). Each
 * recorded decision the core makes is made again from the fold of the log
 * before it, and must come out the same; the log's kept groups must read the
 * same way for `rlq replay` and for the train job.
 */
function recorded(name: string): LoggedDecision[] {
  const rows = JSON.parse(readFileSync(join(import.meta.dirname, "../fixtures/decision-logs", `${name}.json`), "utf8")) as Array<{
    seq: number;
    kind: string;
    payload: unknown;
  }>;
  return rows.map((r) => parseDecision(r.kind, r.payload, r.seq));
}

const before = (log: LoggedDecision[], seq: number) => fold("r", log.slice(0, seq));

function checkLoads(log: LoggedDecision[]): void {
  const state = fold("r", log);
  const c = state.config;
  const outcomes = outcomeLoads(c, log);
  const seals = log.flatMap((d) => (d.kind === "step.sealed" ? [d.payload] : []));
  expect(seals.map((s) => s.step)).toEqual([...Array(totalSteps(state)).keys()]);
  for (const seal of seals) {
    const verdicts = log.flatMap((d) => (d.kind === "group.filtered" && d.payload.step === seal.step ? [d.payload] : []));
    const { loads, missing } = stepLoads(c, seal.step, seal.kept, verdicts);
    expect(missing).toBeNull();
    const kept = outcomes.filter((o) => o.step === seal.step && o.outcome === "kept");
    expect(loads).toEqual(seal.kept.map((g) => kept.find((o) => o.groupId === g)?.load));
  }
  // Each kept group is trained in exactly one step.
  const keptIds = seals.flatMap((s) => s.kept);
  expect(new Set(keptIds).size).toBe(keptIds.length);
  expect(keptIds.length).toBe(totalSteps(state) * c.rollout_batch_size);
}

describe("recorded decision log: sync mode with partial rollouts (sync-partial)", () => {
  const log = recorded("sync-partial");

  it("folds to a completed run", () => {
    const s = fold("r", log);
    expect(s.status).toBe("completed");
    expect(s.lastTrainedStep).toBe(totalSteps(s) - 1);
    expect(s.acceptedGroups).toBe(totalSteps(s) * s.config.rollout_batch_size);
  });

  it("seals each step exactly as recorded, from the state before the seal", () => {
    const seals = log.filter((d) => d.kind === "step.sealed");
    expect(seals.some((d) => d.kind === "step.sealed" && d.payload.aborted.length > 0)).toBe(true);
    for (const d of seals) {
      const s = before(log, d.seq);
      expect(sealDecision(s)).toEqual({ kind: d.kind, payload: d.payload });
      // Before its last kept group the batch was not full yet.
      const lastKept = log.slice(0, d.seq).findLast((x) => x.kind === "group.outcome" && x.payload.outcome === "kept");
      expect(sealDecision(before(log, lastKept?.seq ?? 0))).toBeNull();
    }
  });

  it("draws another batch only when kept + in flight cannot fill the step", () => {
    for (const d of log.filter((x) => x.kind === "prompts.drawn")) expect(shouldDrawMore(before(log, d.seq))).toBe(true);
  });

  it("reads every kept group at the same round with the same masks for replay and for the train job", () => {
    checkLoads(log);
    // The buffered group resumed in a later round: everything before that round is masked off-policy.
    const resumed = outcomeLoads(fold("r", log).config, log).filter((o) => o.load.round > 0);
    expect(resumed.length).toBeGreaterThan(0);
    for (const o of resumed) expect(o.load.maskBeforeRound).toBe(o.load.round);
  });
});

describe("recorded decision log: async mode, k = 1, mask (async-k1)", () => {
  const log = recorded("async-k1");

  it("folds to a completed run", () => {
    const s = fold("r", log);
    expect(s.status).toBe("completed");
    expect(s.weightVersion).toBe(totalSteps(s));
  });

  it("admits exactly the groups the bound allows, at every draw", () => {
    for (const d of log) {
      if (d.kind !== "prompts.drawn") continue;
      const drawn = d.payload.fromBuffer.length + d.payload.fresh.length;
      // During an abort-mode sync on SGLang (controller/async-pipeline.ts continueDuringSync) the
      // groups are drawn for the version it loads.
      const s = before(log, d.seq);
      expect(admission(s, s.syncing?.weightVersion)).toBe(drawn);
    }
  });

  it("syncs when due, aborting only rounds still in flight", () => {
    const syncs = log.filter((d) => d.kind === "weights.syncing");
    expect(log.some((d) => d.kind === "group.aborted")).toBe(true);
    for (const d of syncs) {
      const s = before(log, d.seq);
      expect(isSyncDue(s)).toBe(true);
      const intent = syncDecisions(s, new Set());
      expect(intent[0]).toEqual({ kind: d.kind, payload: d.payload });
      // The aborts recorded in the same commit are among the in-flight rounds the core would abort.
      const aborts = [];
      for (const next of log.slice(d.seq + 1)) {
        if (next.kind !== "group.aborted") break;
        aborts.push({ kind: next.kind, payload: next.payload });
      }
      for (const a of aborts) expect(intent).toContainEqual(a);
    }
  });

  it("masks tokens older than each step's bound in the groups it keeps, for replay and the train job alike", () => {
    checkLoads(log);
    for (const o of outcomeLoads(fold("r", log).config, log)) expect(o.load.minVersion).toBe(o.outcome === "kept" ? o.step - 1 : null);
  });
});

/**
 * Both logs were recorded before the config's version 2 (scripts/record-decision-logs.ts at the
 * commit that wrote them): their run.created config has no config_version and names the train
 * job's attempts `max_attempts`, a key today's schema no longer has (config/config-versions.ts).
 * They fold through the version chain; a restart from a snapshot the older rlq wrote (its config
 * at version 1) reaches the same state as the fold, and so does an amendment recorded under the old name.
 */
describe("recorded decision logs replay after a config key they used was renamed", () => {
  const plain = (s: RunState) =>
    JSON.parse(JSON.stringify(s, (_k, v: unknown) => (v instanceof Map || v instanceof Set ? { [v.constructor.name]: [...v] } : v))) as unknown;

  for (const name of ["sync-partial", "async-k1"]) {
    const log = recorded(name);
    const first = log[0];
    const recordedConfig = first?.kind === "run.created" ? first.payload.config : {};

    it(`${name}: was recorded with the old key, and folds to today's config`, () => {
      const why = `${name}.json must stay a config-version-1 log (scripts/record-decision-logs.ts): restore it from git`;
      expect(recordedConfig, why).toHaveProperty("max_attempts", 3);
      expect(recordedConfig, why).not.toHaveProperty("config_version");
      expect(() => parseRunConfig(recordedConfig, "today's schema alone")).toThrow(/max_attempts/);
      const s = fold("r", log);
      expect(s.config.train_max_attempts).toBe(3);
      expect(s.config).not.toHaveProperty("max_attempts");
      expect(s.status).toBe("completed");
    });

    it(`${name}: restarts from the older rlq's snapshot (config at version 1) to the state of the whole fold`, () => {
      const whole = fold("r", log);
      for (const cut of [2, Math.floor(log.length / 3), Math.floor((2 * log.length) / 3), log.length - 1]) {
        // What the older rlq wrote: its state's config was the recorded one, with no version key.
        const written = { ...snapshotRunState(fold("r", log.slice(0, cut))), config: recordedConfig };
        const restored = restoreRunState("r", JSON.parse(JSON.stringify(written)));
        expect(restored, `cut ${cut}`).not.toBeNull();
        const state = restored as RunState;
        for (const d of log.slice(cut)) apply(state, d);
        expect(plain(state), `cut ${cut}`).toEqual(plain(whole));
      }
    });

    it(`${name}: takes an amendment recorded under the old key name`, () => {
      const amended: LoggedDecision = { kind: "run.amended", payload: { changes: { max_attempts: 6 } }, seq: log.length };
      expect(fold("r", [...log, amended]).config.train_max_attempts).toBe(6);
    });
  }
});

/**
 * The controller commits through applyDecisions (controller/controller.ts): a part that holds the
 * state across `await h.commit(...)` holds the state it read, unchanged. Over the recorded logs,
 * decision by decision, the state given is left as it was and the states reach the fold.
 */
describe("recorded decision logs through applyDecisions", () => {
  const plain = (s: RunState) =>
    JSON.parse(JSON.stringify(s, (_k, v: unknown) => (v instanceof Map || v instanceof Set ? { [v.constructor.name]: [...v] } : v))) as unknown;
  for (const name of ["sync-partial", "async-k1"]) {
    it(`${name}: no decision changes the state it was applied to`, () => {
      const log = recorded(name);
      let state = emptyState("r");
      for (const d of log) {
        const before = plain(state);
        const next = applyDecisions(state, [d]);
        expect(plain(state), `after ${d.kind} (seq ${d.seq})`).toEqual(before);
        state = next;
      }
      expect(plain(state)).toEqual(plain(fold("r", log)));
    });
  }
});
