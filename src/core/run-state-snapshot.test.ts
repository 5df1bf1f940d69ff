import { describe, expect, it } from "vitest";
import { apply, applyDecisions, emptyState, fold, type RunState } from "./run-state.ts";
import { restoreRunState, snapshotRunState } from "./run-state-snapshot.ts";
import type { Decision, LoggedDecision } from "./decisions.ts";

const config = (over: Record<string, unknown>) => ({
  prompt_data: "p.jsonl",
  rm_type: "math",
  rollout_batch_size: 2,
  n_samples_per_prompt: 2,
  num_rollout: 3,
  rollout_max_response_len: 16,
  engine: { kind: "sglang", urls: ["http://127.0.0.1:1"] },
  trainer: { kind: "remote", url: "http://127.0.0.1:2" },
  ...over,
});

const created = (over: Record<string, unknown>): Decision => ({
  kind: "run.created",
  payload: { config: config(over), datasetFingerprint: "f", datasetSize: 10, datasetErrors: [], pluginFingerprints: { custom_rm_path: "abc" }, name: "t" },
});
const drawn = (step: number, fresh: number[], fromBuffer: number[] = []): Decision => ({
  kind: "prompts.drawn",
  payload: {
    step,
    fromBuffer,
    fresh: fresh.map((g) => ({ groupId: g, epoch: 0, datasetIndex: g })),
    cursor: { epoch: 0, offset: fresh[fresh.length - 1] ?? 0, nextOrdinal: (fresh[fresh.length - 1] ?? 0) + 1 },
  },
});
const dispatched = (groupId: number, round: number, step: number, weightVersion = 0): Decision => ({
  kind: "group.dispatched",
  payload: { groupId, round, step, weightVersion },
});
const outcome = (groupId: number, step: number, o: "kept" | "filtered" | "buffered" | "discarded"): Decision => ({
  kind: "group.outcome",
  payload: { groupId, step, outcome: o, reason: o === "kept" ? null : "why" },
});

/** Two sync steps with a buffer, a filter, an eval and an amendment; then an async history with aborts and a cut. */
const histories: Record<string, Decision[]> = {
  sync: [
    created({ over_sampling_batch_size: 4 }),
    { kind: "run.status", payload: { status: "running", reason: null } },
    { kind: "eval.dispatched", payload: { step: 0, weightVersion: 0 } },
    { kind: "eval.recorded", payload: { step: 0 } },
    { kind: "step.started", payload: { step: 0, weightVersion: 0 } },
    drawn(0, [0, 1, 2, 3]),
    dispatched(0, 0, 0),
    dispatched(1, 0, 0),
    dispatched(2, 0, 0),
    dispatched(3, 0, 0),
    { kind: "group.filtered", payload: { groupId: 0, round: 0, step: 0, keep: true, reason: null } },
    outcome(0, 0, "kept"),
    outcome(1, 0, "filtered"),
    outcome(2, 0, "kept"),
    { kind: "step.sealed", payload: { step: 0, kept: [0, 2], aborted: [{ groupId: 3, round: 0 }] } },
    outcome(3, 0, "buffered"),
    { kind: "train.dispatched", payload: { step: 0, weightVersionIn: 0 } },
    { kind: "step.trained", payload: { step: 0, weightVersionOut: 1, checkpointUri: "file:///c0" } },
    { kind: "weights.synced", payload: { step: 0, weightVersion: 1, checkpointUri: "file:///c0" } },
    { kind: "run.amended", payload: { changes: { num_rollout: 5 } } },
    { kind: "step.started", payload: { step: 1, weightVersion: 1 } },
    drawn(1, [4, 5, 6], [3]),
    dispatched(3, 1, 1, 1),
    dispatched(4, 0, 1, 1),
    outcome(4, 1, "discarded"),
    { kind: "eval.dispatched", payload: { step: 1, weightVersion: 1 } },
    { kind: "run.status", payload: { status: "paused", reason: "operator" } },
  ],
  async: [
    created({ train_async: true }),
    { kind: "step.started", payload: { step: 0, weightVersion: 0 } },
    drawn(0, [0, 1, 2]),
    dispatched(0, 0, 0),
    dispatched(1, 0, 0),
    dispatched(2, 0, 0),
    outcome(0, 0, "kept"),
    { kind: "step.sealed", payload: { step: 0, kept: [0], aborted: [] } },
    { kind: "step.started", payload: { step: 1, weightVersion: 0 } },
    outcome(1, 1, "kept"),
    { kind: "step.sealed", payload: { step: 1, kept: [1], aborted: [] } },
    { kind: "train.dispatched", payload: { step: 0, weightVersionIn: 0 } },
    { kind: "step.trained", payload: { step: 0, weightVersionOut: 1, checkpointUri: "file:///c0" } },
    { kind: "weights.syncing", payload: { step: 0, weightVersion: 1, mode: "abort" } },
    { kind: "group.aborted", payload: { groupId: 2, round: 0, step: 1, reason: "weight sync to version 1" } },
    { kind: "weights.synced", payload: { step: 0, weightVersion: 1, checkpointUri: "file:///c0" } },
    { kind: "group.cut", payload: { groupId: 2, step: 1, round: 1, samples: [1], reason: "stale" } },
    dispatched(2, 1, 1, 1),
    { kind: "train.dispatched", payload: { step: 1, weightVersionIn: 1 } },
  ],
};

const logged = (list: Decision[]): LoggedDecision[] => list.map((d, seq) => ({ ...d, seq }));
/** The state as plain data, Maps and Sets in their iteration order (that order is part of the state). */
const plain = (s: RunState) =>
  JSON.parse(JSON.stringify(s, (_k, v: unknown) => (v instanceof Map || v instanceof Set ? { [v.constructor.name]: [...v] } : v))) as unknown;

describe("run state snapshots", () => {
  for (const [name, history] of Object.entries(histories)) {
    it(`${name}: a snapshot at every seq, stored as JSON, then the rest of the log, gives the fold of the whole log`, () => {
      const log = logged(history);
      const whole = fold("r", log);
      for (let k = 1; k <= log.length; k++) {
        const snap = JSON.parse(JSON.stringify(snapshotRunState(fold("r", log.slice(0, k))))) as unknown;
        const restored = restoreRunState("r", snap);
        expect(restored).not.toBeNull();
        expect(plain(restored as RunState)).toEqual(plain(fold("r", log.slice(0, k))));
        for (const d of log.slice(k)) apply(restored as RunState, d);
        expect(plain(restored as RunState)).toEqual(plain(whole));
      }
    });
  }

  for (const [name, history] of Object.entries(histories)) {
    it(`${name}: applyDecisions leaves the state it is given as it was, one decision at a time, and ends at the fold`, () => {
      const log = logged(history);
      let state = emptyState("r");
      for (const d of log) {
        const before = plain(state);
        const next = applyDecisions(state, [d]);
        expect(plain(state), `after ${d.kind} (seq ${d.seq})`).toEqual(before);
        expect(next).not.toBe(state);
        state = next;
      }
      expect(plain(state)).toEqual(plain(fold("r", log)));
    });
  }

  it("is not used for another run, another format or a damaged shape", () => {
    const snap = snapshotRunState(fold("r", logged(histories.sync ?? [])));
    expect(restoreRunState("other", snap)).toBeNull();
    expect(restoreRunState("r", { ...snap, format: 99 })).toBeNull();
    expect(restoreRunState("r", { ...snap, groups: { ...snap.groups, phases: snap.groups.phases.slice(1) } })).toBeNull();
    expect(restoreRunState("r", { ...snap, groups: { ...snap.groups, phases: snap.groups.phases.map(() => 42) } })).toBeNull();
  });
});
