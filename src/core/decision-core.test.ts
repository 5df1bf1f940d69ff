import { describe, expect, it } from "vitest";
import { apply, fold, type RunState } from "./run-state.ts";
import type { Decision, LoggedDecision } from "./decisions.ts";
import { decideGroups, dispatchDecision, sealDecision, shouldDrawMore, type ReadyGroup } from "./decide-groups.ts";
import { groupLoad, outcomeLoads, stepLoads } from "./group-load.ts";
import { admission, isAsyncRunDone, isSyncDue, syncDecisions } from "./pipeline.ts";
import type { AssembledSample } from "./sample.ts";
import type { DynamicFilterOutput } from "../filters/dynamic-filter.ts";

/**
 * The decision core over decision logs built from the decisions the
 * controller writes: each log below is produced by driving the core itself
 * (draw → dispatch → decide → seal → drain → train → sync) the way
 * controller/sync-step.ts and controller/async-pipeline.ts do, against a
 * scripted world (which rounds land, with which samples and verdicts). The
 * assertions then read the log back the three ways the system does: the fold
 * (restart), `outcomeLoads` (replay) and `stepLoads` (the train job).
 */
const config = (over: Record<string, unknown>) => ({
  prompt_data: "p.jsonl",
  rm_type: "math",
  rollout_batch_size: 2,
  n_samples_per_prompt: 2,
  num_rollout: 2,
  rollout_max_response_len: 16,
  engine: { kind: "sglang", urls: ["http://127.0.0.1:1"] },
  trainer: { kind: "remote", url: "http://127.0.0.1:2" },
  ...over,
});

/** A run's log as the controller appends it: gapless seqs, each decision folded as it is written. */
class Log {
  readonly list: LoggedDecision[] = [];
  state: RunState;
  constructor(over: Record<string, unknown>) {
    const created: Decision = {
      kind: "run.created",
      payload: { config: config(over), datasetFingerprint: "f", datasetSize: 100, datasetErrors: [], pluginFingerprints: {}, name: "t" },
    };
    this.list.push({ ...created, seq: 0 }, { kind: "run.status", payload: { status: "running", reason: null }, seq: 1 });
    this.state = fold("r", this.list);
  }
  /** Appends and folds each decision; a null (sealDecision's "nothing to seal yet") is skipped, as the controller skips it. */
  commit(...ds: Array<Decision | null>): void {
    for (const d of ds) {
      if (d === null) continue;
      const logged: LoggedDecision = { ...d, seq: this.list.length };
      this.list.push(logged);
      apply(this.state, logged);
    }
  }
  /** A fresh draw of `n` groups (the cursor's next ordinals), dispatched at round 0. */
  draw(n: number, fromBuffer: number[] = []): void {
    const s = this.state;
    const first = s.cursor.nextOrdinal;
    const fresh = Array.from({ length: n }, (_, i) => ({ groupId: first + i, epoch: 0, datasetIndex: first + i }));
    this.commit(
      { kind: "prompts.drawn", payload: { step: s.step, fromBuffer, fresh, cursor: { epoch: 0, offset: first + n, nextOrdinal: first + n } } },
      ...fromBuffer.map((g) => dispatchDecision(s, g, (s.groups.get(g)?.round ?? -1) + 1)),
      ...fresh.map((f) => dispatchDecision(s, f.groupId, 0)),
    );
  }
}

/** A finished sample whose trained tokens all come from `versions`. */
function sample(sampleIndex: number, versions: number[]): AssembledSample {
  return {
    sampleIndex,
    responseTokens: versions.map(() => 7),
    logProbs: versions.map(() => -1),
    lossMask: versions.map(() => 1),
    denomMask: versions.map(() => 1),
    tokenVersions: versions,
    weightVersions: [...new Set(versions)],
    numSegments: new Set(versions).size,
    nextSegmentIndex: new Set(versions).size,
    oldestVersion: versions.length === 0 ? null : Math.min(...versions),
    status: "completed",
    finishReason: "stop",
  };
}

const keep: DynamicFilterOutput = { keep: true, reason: null, keep_when_insufficient: false };
const drop: DynamicFilterOutput = { keep: false, reason: "zero_std", keep_when_insufficient: false };

function ready(s: RunState, groupId: number, verdict: DynamicFilterOutput = keep, versions = [s.weightVersion]): ReadyGroup {
  const round = s.groups.get(groupId)?.round ?? 0;
  return { groupId, round, samples: [sample(0, versions), sample(1, versions)], verdict };
}

/** The controller's train → sync blocks in sync mode (step-blocks.ts), with the trainer's commit. */
function trainAndSync(log: Log): void {
  const s = log.state;
  log.commit({ kind: "train.dispatched", payload: { step: s.step, weightVersionIn: s.trainedVersion } });
  log.commit({ kind: "step.trained", payload: { step: s.step, weightVersionOut: s.trainedVersion + 1, checkpointUri: `file:///c${s.step}` } });
  log.commit({ kind: "weights.synced", payload: { step: s.step, weightVersion: s.trainedVersion, checkpointUri: `file:///c${s.step}` } });
  if (s.step + 1 < (s.config.num_rollout ?? 0)) log.commit({ kind: "step.started", payload: { step: s.step + 1, weightVersion: s.weightVersion } });
  else log.commit({ kind: "run.status", payload: { status: "completed", reason: null } });
}

describe("the decision core, sync mode with partial rollouts", () => {
  /** Step 0: 3 groups over-sampled, 0 and 2 complete (2 filtered out), 3 drawn, 1 and 3 complete, 4 aborted at the seal. */
  function syncLog(over: Record<string, unknown> = {}): Log {
    const log = new Log({ partial_rollout: true, over_sampling_batch_size: 3, mask_offpolicy_in_partial_rollout: true, ...over });
    const s = log.state;
    log.draw(3);
    let d = decideGroups(s, [ready(s, 0), ready(s, 2, drop)]);
    log.commit(...d.decisions);
    expect(sealDecision(s)).toBeNull();
    expect(shouldDrawMore(s)).toBe(false); // 1 kept + 1 in flight fill the batch
    d = decideGroups(s, [ready(s, 1, drop)]);
    log.commit(...d.decisions);
    expect(shouldDrawMore(s)).toBe(true);
    log.draw(2);
    d = decideGroups(s, [ready(s, 3)]);
    log.commit(...d.decisions);
    const seal = sealDecision(s);
    expect(seal).toEqual({ kind: "step.sealed", payload: { step: 0, kept: [0, 3], aborted: [{ groupId: 4, round: 0 }] } });
    log.commit(seal);
    // Drain: the aborted round landed; partial_rollout buffers it.
    log.commit({ kind: "group.outcome", payload: { groupId: 4, step: 0, outcome: "buffered", reason: "aborted" } });
    trainAndSync(log);
    // Step 1: the buffered group resumes first (round 1), with one fresh group.
    log.draw(1, [4]);
    d = decideGroups(s, [ready(s, 5), ready(s, 4, keep, [0, 1])]);
    log.commit(...d.decisions);
    log.commit(sealDecision(s));
    trainAndSync(log);
    return log;
  }

  it("folds the log it wrote back to the state it had, and finishes the run", () => {
    const log = syncLog();
    const refolded = fold("r", log.list);
    expect(refolded.status).toBe("completed");
    expect(refolded.seq).toBe(log.state.seq);
    expect(refolded.cursor).toEqual(log.state.cursor);
    expect(refolded.acceptedGroups).toBe(4);
    expect(refolded.groups.get(4)).toMatchObject({ round: 1, phase: "kept", step: 1 });
    expect(refolded.buffer).toEqual([]);
  });

  it("replay and the train job read each kept group at the same round with the same masks", () => {
    const log = syncLog();
    const c = log.state.config;
    const outcomes = outcomeLoads(c, log.list);
    expect(outcomes.map((o) => [o.groupId, o.step, o.outcome, o.reason])).toEqual([
      [0, 0, "kept", null],
      [2, 0, "filtered", "zero_std"],
      [1, 0, "filtered", "zero_std"],
      [3, 0, "kept", null],
      [5, 1, "kept", null],
      [4, 1, "kept", null],
    ]);
    // The resumed group trains on round 1: everything generated before it is off-policy (masked).
    expect(outcomes.find((o) => o.groupId === 4)?.load).toEqual({ groupId: 4, round: 1, maskBeforeRound: 1, minVersion: null });
    for (const step of [0, 1]) {
      const seal = log.list.find((d) => d.kind === "step.sealed" && d.payload.step === step);
      if (seal?.kind !== "step.sealed") throw new Error("no seal");
      const verdicts = log.list.flatMap((d) => (d.kind === "group.filtered" && d.payload.step === step ? [d.payload] : []));
      const { loads, missing } = stepLoads(c, step, seal.payload.kept, verdicts);
      expect(missing).toBeNull();
      const replayed = outcomes.filter((o) => o.step === step && o.outcome === "kept").map((o) => o.load);
      expect(loads).toEqual([...replayed].sort((a, b) => a.groupId - b.groupId));
    }
  });

  it("without partial_rollout the aborted round is discarded and read at the round the seal aborted", () => {
    const log = new Log({ over_sampling_batch_size: 3 });
    const s = log.state;
    log.draw(3);
    // Group 2's first round ended unfinished (an engine failure): it continues as round 1.
    log.commit(dispatchDecision(s, 2, 1));
    log.commit(...decideGroups(s, [ready(s, 0), ready(s, 1)]).decisions);
    log.commit(sealDecision(s));
    expect(log.list.at(-1)?.payload).toMatchObject({ aborted: [{ groupId: 2, round: 1 }] });
    log.commit({ kind: "group.outcome", payload: { groupId: 2, step: 0, outcome: "discarded", reason: "aborted" } });
    const aborted = outcomeLoads(s.config, log.list).find((o) => o.groupId === 2);
    expect(aborted).toEqual({
      groupId: 2,
      step: 0,
      outcome: "discarded",
      reason: "aborted",
      load: { groupId: 2, round: 1, maskBeforeRound: null, minVersion: null },
    });
  });

  it("surplus groups that pass after the batch is full are buffered, or discarded without partial_rollout", () => {
    for (const partial of [true, false]) {
      const log = new Log({ partial_rollout: partial, over_sampling_batch_size: 3 });
      const s = log.state;
      log.draw(3);
      const d = decideGroups(s, [ready(s, 0), ready(s, 1), ready(s, 2)]);
      expect(d.decisions.filter((x) => x.kind === "group.outcome").map((x) => x.payload)).toEqual([
        { groupId: 0, step: 0, outcome: "kept", reason: null },
        { groupId: 1, step: 0, outcome: "kept", reason: null },
        { groupId: 2, step: 0, outcome: partial ? "buffered" : "discarded", reason: "surplus" },
      ]);
      // A buffered group has no history rows yet (it is judged again when it completes).
      expect(d.outcomes.map((o) => o.groupId)).toEqual(partial ? [0, 1] : [0, 1, 2]);
    }
  });

  it("keep_when_insufficient keeps a rejected group only when dropping it would force another draw", () => {
    const log = new Log({ over_sampling_batch_size: 2 });
    const s = log.state;
    log.draw(2);
    const soft = { keep: false, reason: "zero_std", keep_when_insufficient: true };
    const d = decideGroups(s, [ready(s, 0, soft), ready(s, 1, soft)]);
    expect(d.decisions.filter((x) => x.kind === "group.outcome").map((x) => x.payload.outcome)).toEqual(["kept", "kept"]);
    const log3 = new Log({ over_sampling_batch_size: 3 });
    log3.draw(3);
    const d3 = decideGroups(log3.state, [ready(log3.state, 0, soft)]);
    expect(d3.decisions.filter((x) => x.kind === "group.outcome").map((x) => x.payload.outcome)).toEqual(["filtered"]);
  });
});

describe("the decision core, staleness policies", () => {
  /** Step 0 trains; group 2 generated at version 0 completes in step 2 (two versions later). */
  function staleLog(over: Record<string, unknown>): { log: Log; stale: ReadyGroup } {
    const log = new Log({ partial_rollout: true, over_sampling_batch_size: 3, rollout_batch_size: 1, num_rollout: 3, max_staleness: 1, ...over });
    const s = log.state;
    log.draw(2);
    log.commit(...decideGroups(s, [ready(s, 0)]).decisions);
    log.commit(sealDecision(s));
    log.commit({ kind: "group.outcome", payload: { groupId: 1, step: 0, outcome: "buffered", reason: "aborted" } });
    trainAndSync(log);
    log.draw(1);
    log.commit(...decideGroups(s, [ready(s, 2)]).decisions);
    log.commit(sealDecision(s));
    trainAndSync(log);
    log.draw(0, [1]);
    return { log, stale: ready(s, 1, keep, [0, 0, 2]) };
  }

  it("mask keeps the group and masks tokens older than the step's bound, in replay and in the batch alike", () => {
    const { log, stale } = staleLog({ staleness_policy: "mask" });
    const s = log.state;
    const d = decideGroups(s, [stale]);
    expect(d.outcomes).toEqual([{ groupId: 1, step: 2, outcome: "kept", reason: null, load: { groupId: 1, round: 1, maskBeforeRound: null, minVersion: 1 } }]);
    log.commit(...d.decisions, sealDecision(s));
    const replayed = outcomeLoads(s.config, log.list).find((o) => o.groupId === 1 && o.step === 2);
    const verdicts = log.list.flatMap((x) => (x.kind === "group.filtered" && x.payload.step === 2 ? [x.payload] : []));
    expect(stepLoads(s.config, 2, [1], verdicts).loads).toEqual([replayed?.load]);
  });

  it("drop cuts the stale samples and regenerates them in the same commit, then discards after max_regenerations", () => {
    const { log, stale } = staleLog({ staleness_policy: "drop", max_regenerations: 1 });
    const s = log.state;
    const d = decideGroups(s, [{ ...stale, samples: [sample(0, [0, 2]), sample(1, [2])] }]);
    expect(d.decisions).toEqual([
      { kind: "group.filtered", payload: { groupId: 1, round: 1, step: 2, keep: true, reason: null } },
      {
        kind: "group.cut",
        payload: { groupId: 1, step: 2, round: 2, samples: [0], reason: "stale: 1 sample(s) up to 2 versions stale for step 2 (max_staleness 1)" },
      },
      { kind: "group.dispatched", payload: { groupId: 1, round: 2, step: 2, weightVersion: 2 } },
    ]);
    expect(d.regenerate).toEqual([{ groupId: 1, round: 2 }]);
    expect(d.outcomes).toEqual([]);
    log.commit(...d.decisions);
    expect(s.groups.get(1)).toMatchObject({ round: 2, regenerations: 1, phase: "inflight" });
    // The regenerated round is stale again (an engine still at an old version): out of regenerations.
    const again = decideGroups(s, [{ ...ready(s, 1), samples: [sample(0, [0]), sample(1, [2])] }]);
    expect(again.outcomes.map((o) => [o.outcome, o.reason])).toEqual([
      ["discarded", "stale: 1 sample(s) up to 2 versions stale for step 2 (max_staleness 1), after 1 regeneration(s)"],
    ]);
    // The train job reads the round of the last keep verdict: the cut round's verdict is superseded.
    log.commit(...decideGroups(s, [ready(s, 1)]).decisions, sealDecision(s));
    const verdicts = log.list.flatMap((x) => (x.kind === "group.filtered" && x.payload.step === 2 ? [x.payload] : []));
    expect(stepLoads(s.config, 2, [1], verdicts).loads.map((l) => l.round)).toEqual([2]);
    expect(outcomeLoads(s.config, log.list).find((o) => o.groupId === 1 && o.step === 2)?.load.round).toBe(2);
  });

  it("a kept group with no keep verdict in its step is reported, not trained on a guessed round", () => {
    const c = new Log({}).state.config;
    expect(stepLoads(c, 0, [0, 1], [{ groupId: 0, round: 0, keep: true }])).toEqual({
      loads: [groupLoad(c, { groupId: 0, round: 0, step: 0, outcome: "kept" })],
      missing: 1,
    });
    expect(stepLoads(c, 0, [0], [{ groupId: 0, round: 0, keep: false }]).missing).toBe(0);
  });
});

describe("the decision core, async pipeline", () => {
  it("groups join the earliest unsealed step, admission follows (k + v + 1) × rbs, and a sync aborts what has not landed", () => {
    const log = new Log({ train_async: true, rollout_batch_size: 1, num_rollout: 4, over_sampling_batch_size: 4, max_staleness: 2 });
    const s = log.state;
    // k = 2, v = 0: (2 + 0 + 1) × 1 = 3 groups.
    expect(admission(s)).toBe(3);
    log.draw(admission(s));
    expect(admission(s)).toBe(0);
    const d = decideGroups(s, [ready(s, 0), ready(s, 1)]);
    expect(d.decisions.map((x) => x.kind)).toEqual([
      "group.filtered",
      "group.outcome",
      "step.sealed",
      "step.started",
      "group.filtered",
      "group.outcome",
      "step.sealed",
      "step.started",
    ]);
    expect(d.outcomes.map((o) => [o.groupId, o.step])).toEqual([
      [0, 0],
      [1, 1],
    ]);
    log.commit(...d.decisions);
    expect(s.trainQueue).toEqual([0, 1]);
    expect(s.step).toBe(2);
    expect([...s.inflight]).toEqual([2]);
    expect(admission(s)).toBe(0); // 2 accepted + 1 running fill the bound until version 1
    expect(isSyncDue(s)).toBe(false);
    log.commit({ kind: "train.dispatched", payload: { step: 0, weightVersionIn: 0 } });
    log.commit({ kind: "step.trained", payload: { step: 0, weightVersionOut: 1, checkpointUri: "file:///c0" } });
    expect(isSyncDue(s)).toBe(true);
    const intent = syncDecisions(s, new Set());
    expect(intent).toEqual([
      { kind: "weights.syncing", payload: { step: 0, weightVersion: 1, mode: "abort" } },
      { kind: "group.aborted", payload: { groupId: 2, round: 0, step: 2, reason: "weight sync to version 1" } },
    ]);
    // A round that already landed is not aborted.
    expect(syncDecisions(s, new Set([2]))).toEqual(intent.slice(0, 1));
    log.commit(...intent);
    expect([...s.draining]).toEqual([[2, 0]]);
    log.commit({ kind: "weights.synced", payload: { step: 0, weightVersion: 1, checkpointUri: "file:///c0" } });
    // v = 1: one more group may start; the aborted one still counts as running until it resumes.
    expect(admission(s)).toBe(1);
    expect(isAsyncRunDone(s)).toBe(false);
    expect(fold("r", log.list).trainQueue).toEqual([1]);
  });

  it("an in_place sync aborts nothing: its intent is weights.syncing alone", () => {
    const log = new Log({ train_async: true, rollout_batch_size: 1, num_rollout: 4, over_sampling_batch_size: 4, max_staleness: 2 });
    const s = log.state;
    log.draw(admission(s));
    log.commit(...decideGroups(s, [ready(s, 0), ready(s, 1)]).decisions);
    log.commit({ kind: "train.dispatched", payload: { step: 0, weightVersionIn: 0 } });
    log.commit({ kind: "step.trained", payload: { step: 0, weightVersionOut: 1, checkpointUri: "file:///c0" } });
    expect([...s.inflight]).toEqual([2]);
    // in_place runs on vLLM only (run-config.ts refineInPlace); the decision is pure in the config.
    const inPlace = { ...s, config: { ...s.config, weight_update_mode: "in_place" as const } };
    expect(syncDecisions(inPlace, new Set())).toEqual([{ kind: "weights.syncing", payload: { step: 0, weightVersion: 1, mode: "in_place" } }]);
  });

  it("admission is capped by the run's remaining steps", () => {
    const log = new Log({ train_async: true, rollout_batch_size: 2, num_rollout: 1, over_sampling_batch_size: 8, max_staleness: 3 });
    expect(admission(log.state)).toBe(2);
  });
});
