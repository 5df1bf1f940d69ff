/**
 * A run's folded state at one decision seq, as plain JSON: what a restarted
 * controller starts from instead of folding the whole decision log (a 1M-sample
 * run has ~250k decisions; folding them all took most of a restart). The state
 * after the snapshot is `apply` of the decisions after `seq`, so a snapshot is
 * exact or it is not used: `restoreRunState(snapshotRunState(s))` deep-equals
 * `s` (run-state-snapshot.test.ts checks it against a folded recorded history).
 *
 * Groups go as five parallel integer columns, not objects (format 1 held every group ever drawn:
 * 125k of them at 1M samples; format 2 only the live ones).
 */

import { z } from "zod";
import { decodeRecordedConfig } from "../config/recorded-config.ts";
import { withConfigVersion } from "../config/config-versions.ts";
import { emptyState, type GroupPhase, type RunState } from "./run-state.ts";

// 2: the groups are only those the state still holds (run-state.ts forgetDecidedGroups); a format-1
// snapshot holds every group ever drawn and is not used (the log is folded instead).
export const SNAPSHOT_FORMAT = 2;

const groupPhases: readonly GroupPhase[] = ["inflight", "kept", "filtered", "buffered", "discarded", "draining"];
/**
 * An array of integers, checked by a plain loop: zod's per-element checks of a 1M-sample run's
 * group columns (5 × 125k numbers) took most of a restart (bench/recovery.ts).
 */
const ints = z.custom<number[]>((v) => {
  if (!Array.isArray(v)) return false;
  for (const x of v as unknown[]) if (!Number.isInteger(x)) return false;
  return true;
}, "expected an array of integers");

const snapshotSchema = z.object({
  format: z.literal(SNAPSHOT_FORMAT),
  runId: z.string(),
  seq: z.number().int(),
  name: z.string(),
  config: z.record(z.string(), z.unknown()),
  status: z.enum(["created", "running", "paused", "cancelled", "completed"]),
  statusReason: z.string().nullable(),
  datasetSize: z.number().int(),
  datasetFingerprint: z.string(),
  pluginFingerprints: z.record(z.string(), z.string()),
  cursor: z.object({ epoch: z.number().int(), offset: z.number().int(), nextOrdinal: z.number().int() }),
  step: z.number().int(),
  phase: z.enum(["collect", "drain", "train", "sync", "done"]),
  weightVersion: z.number().int(),
  checkpointUri: z.string().nullable(),
  trainedVersion: z.number().int(),
  trainedCheckpointUri: z.string().nullable(),
  buffer: ints,
  /** Columns of the groups, in the Map's insertion order (draw order). */
  groups: z.object({ ids: ints, rounds: ints, regenerations: ints, steps: ints, phases: ints }),
  kept: ints,
  inflight: ints,
  /** [groupId, round] pairs, in the Map's order. */
  draining: z.array(z.tuple([z.number().int(), z.number().int()])),
  sealed: ints,
  evalsDispatched: ints,
  pendingEval: z.object({ step: z.number().int(), weightVersion: z.number().int() }).nullable(),
  acceptedGroups: z.number().int(),
  trainQueue: ints,
  training: z.number().int().nullable(),
  lastTrainedStep: z.number().int(),
  syncing: z.object({ step: z.number().int(), weightVersion: z.number().int() }).nullable(),
  /** Absent in snapshots written before colocated mode: their runs were never colocated. */
  engineMemory: z.enum(["resident", "released", "weights"]).default("resident"),
});
export type RunStateSnapshot = z.infer<typeof snapshotSchema>;

export function snapshotRunState(s: RunState): RunStateSnapshot {
  const n = s.groups.size;
  const ids: number[] = new Array<number>(n);
  const rounds: number[] = new Array<number>(n);
  const regenerations: number[] = new Array<number>(n);
  const steps: number[] = new Array<number>(n);
  const phases: number[] = new Array<number>(n);
  let i = 0;
  for (const g of s.groups.values()) {
    ids[i] = g.groupId;
    rounds[i] = g.round;
    regenerations[i] = g.regenerations;
    steps[i] = g.step;
    phases[i] = groupPhases.indexOf(g.phase);
    i++;
  }
  return {
    format: SNAPSHOT_FORMAT,
    runId: s.runId,
    seq: s.seq,
    name: s.name,
    config: withConfigVersion(s.config),
    status: s.status,
    statusReason: s.statusReason,
    datasetSize: s.datasetSize,
    datasetFingerprint: s.datasetFingerprint,
    pluginFingerprints: { ...s.pluginFingerprints },
    cursor: { ...s.cursor },
    step: s.step,
    phase: s.phase,
    weightVersion: s.weightVersion,
    checkpointUri: s.checkpointUri,
    trainedVersion: s.trainedVersion,
    trainedCheckpointUri: s.trainedCheckpointUri,
    buffer: [...s.buffer],
    groups: { ids, rounds, regenerations, steps, phases },
    kept: [...s.kept],
    inflight: [...s.inflight],
    draining: [...s.draining],
    sealed: [...s.sealed],
    evalsDispatched: [...s.evalsDispatched],
    pendingEval: s.pendingEval ? { ...s.pendingEval } : null,
    acceptedGroups: s.acceptedGroups,
    trainQueue: [...s.trainQueue],
    training: s.training,
    lastTrainedStep: s.lastTrainedStep,
    syncing: s.syncing ? { ...s.syncing } : null,
    engineMemory: s.engineMemory,
  };
}

/**
 * The state a snapshot holds, or null when it cannot be used (another format,
 * another run, or a shape that does not validate): the caller then folds the
 * whole log, which is always correct.
 */
export function restoreRunState(runId: string, raw: unknown): RunState | null {
  const parsed = snapshotSchema.safeParse(raw);
  if (!parsed.success || parsed.data.runId !== runId) return null;
  const p = parsed.data;
  const g = p.groups;
  const n = g.ids.length;
  if (g.rounds.length !== n || g.regenerations.length !== n || g.steps.length !== n || g.phases.length !== n) return null;
  const state = emptyState(runId);
  for (let i = 0; i < n; i++) {
    const phase = groupPhases[g.phases[i] as number];
    if (phase === undefined) return null;
    const groupId = g.ids[i] as number;
    state.groups.set(groupId, { groupId, round: g.rounds[i] as number, regenerations: g.regenerations[i] as number, step: g.steps[i] as number, phase });
  }
  // A snapshot written by an older rlq holds its config at that rlq's version: decoded like run.created's.
  state.config = decodeRecordedConfig(p.config, `run ${runId} snapshot config`);
  state.name = p.name;
  state.status = p.status;
  state.statusReason = p.statusReason;
  state.seq = p.seq;
  state.datasetSize = p.datasetSize;
  state.datasetFingerprint = p.datasetFingerprint;
  state.pluginFingerprints = p.pluginFingerprints;
  state.cursor = p.cursor;
  state.step = p.step;
  state.phase = p.phase;
  state.weightVersion = p.weightVersion;
  state.checkpointUri = p.checkpointUri;
  state.trainedVersion = p.trainedVersion;
  state.trainedCheckpointUri = p.trainedCheckpointUri;
  state.buffer = p.buffer;
  state.kept = p.kept;
  state.inflight = new Set(p.inflight);
  state.draining = new Map(p.draining);
  state.sealed = p.sealed;
  state.evalsDispatched = new Set(p.evalsDispatched);
  state.pendingEval = p.pendingEval;
  state.acceptedGroups = p.acceptedGroups;
  state.trainQueue = p.trainQueue;
  state.training = p.training;
  state.lastTrainedStep = p.lastTrainedStep;
  state.syncing = p.syncing;
  state.engineMemory = p.engineMemory;
  return state;
}
