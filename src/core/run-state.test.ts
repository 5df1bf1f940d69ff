import { describe, expect, it } from "vitest";
import { fold } from "./run-state.ts";
import type { Decision, LoggedDecision } from "./decisions.ts";

const config = (over: Record<string, unknown>) => ({
  prompt_data: "p.jsonl",
  rm_type: "math",
  rollout_batch_size: 1,
  n_samples_per_prompt: 2,
  num_rollout: 3,
  rollout_max_response_len: 16,
  engine: { kind: "sglang", urls: ["http://127.0.0.1:1"] },
  trainer: { kind: "remote", url: "http://127.0.0.1:2" },
  ...over,
});

function log(list: Decision[]): LoggedDecision[] {
  return list.map((d, seq) => ({ ...d, seq }));
}

const created = (over: Record<string, unknown>): Decision => ({
  kind: "run.created",
  payload: { config: config(over), datasetFingerprint: "f", datasetSize: 10, datasetErrors: [], pluginFingerprints: {}, name: "t" },
});
const drawn: Decision = {
  kind: "prompts.drawn",
  payload: {
    step: 0,
    fromBuffer: [],
    fresh: [0, 1, 2].map((g) => ({ groupId: g, epoch: 0, datasetIndex: g })),
    cursor: { epoch: 0, offset: 3, nextOrdinal: 3 },
  },
};
const dispatched = (groupId: number, round: number, step = 0, weightVersion = 0): Decision => ({
  kind: "group.dispatched",
  payload: { groupId, round, step, weightVersion },
});

describe("the fold in async mode", () => {
  it("carries in-flight groups across steps, queues sealed steps for the trainer and tracks a sync's aborts", () => {
    const s = fold(
      "r",
      log([
        created({ train_async: true }),
        drawn,
        dispatched(0, 0),
        dispatched(1, 0),
        dispatched(2, 0),
        { kind: "group.outcome", payload: { groupId: 0, step: 0, outcome: "kept", reason: null } },
        { kind: "step.sealed", payload: { step: 0, kept: [0], aborted: [] } },
        { kind: "step.started", payload: { step: 1, weightVersion: 0 } },
        { kind: "group.outcome", payload: { groupId: 1, step: 1, outcome: "kept", reason: null } },
        { kind: "step.sealed", payload: { step: 1, kept: [1], aborted: [] } },
        { kind: "step.started", payload: { step: 2, weightVersion: 0 } },
        { kind: "train.dispatched", payload: { step: 0, weightVersionIn: 0 } },
        { kind: "step.trained", payload: { step: 0, weightVersionOut: 1, checkpointUri: "file:///c0" } },
        { kind: "weights.syncing", payload: { step: 0, weightVersion: 1, mode: "abort" } },
        { kind: "group.aborted", payload: { groupId: 2, round: 0, step: 2, reason: "weight sync to version 1" } },
      ]),
    );
    expect(s.step).toBe(2);
    expect(s.phase).toBe("collect");
    expect(s.acceptedGroups).toBe(2);
    expect(s.trainQueue).toEqual([1]);
    expect(s.training).toBeNull();
    expect(s.lastTrainedStep).toBe(0);
    expect(s.trainedVersion).toBe(1);
    expect(s.weightVersion).toBe(0);
    expect(s.syncing).toEqual({ step: 0, weightVersion: 1 });
    expect([...s.inflight]).toEqual([]);
    expect([...s.draining]).toEqual([[2, 0]]);
    // Groups kept in earlier steps are done: the state holds only what a decision can still name.
    expect([...s.groups.keys()]).toEqual([2]);

    const after = fold(
      "r",
      log([
        created({ train_async: true }),
        drawn,
        dispatched(2, 0),
        { kind: "group.aborted", payload: { groupId: 2, round: 0, step: 0, reason: "sync" } },
        { kind: "weights.synced", payload: { step: 0, weightVersion: 1, checkpointUri: "file:///c0" } },
        dispatched(2, 1, 0, 1),
        { kind: "group.cut", payload: { groupId: 2, step: 0, round: 2, samples: [1], reason: "stale" } },
        dispatched(2, 2, 0, 1),
      ]),
    );
    expect(after.syncing).toBeNull();
    expect(after.weightVersion).toBe(1);
    expect([...after.inflight]).toEqual([2]);
    expect([...after.draining]).toEqual([]);
    expect(after.groups.get(2)).toMatchObject({ round: 2, regenerations: 1, phase: "inflight" });
  });

  it("forgets groups decided in an earlier step at the next step.started, and keeps buffered ones", () => {
    const outcome = (groupId: number, o: string): Decision => ({ kind: "group.outcome", payload: { groupId, step: 0, outcome: o, reason: null } }) as Decision;
    const step0: Decision[] = [
      created({}),
      drawn,
      dispatched(0, 0),
      dispatched(1, 0),
      dispatched(2, 0),
      outcome(0, "kept"),
      outcome(1, "filtered"),
      outcome(2, "buffered"),
    ];
    const s = fold("r", log(step0));
    expect([...s.groups.keys()]).toEqual([0, 1, 2]); // the step's own outcomes stay until the next step
    const next = fold("r", log([...step0, { kind: "step.started", payload: { step: 1, weightVersion: 0 } }]));
    expect([...next.groups.keys()]).toEqual([2]);
    expect(next.groups.get(2)).toMatchObject({ phase: "buffered", round: 0 });
    expect(next.buffer).toEqual([2]);
  });

  it("keeps sync mode's per-step reset", () => {
    const s = fold("r", log([created({}), drawn, dispatched(0, 0), dispatched(1, 0), { kind: "step.started", payload: { step: 1, weightVersion: 0 } }]));
    expect([...s.inflight]).toEqual([]);
    expect(s.step).toBe(1);
  });
});
