/**
 * Which round of a group is read, and how its tokens are masked, when a group
 * with an outcome becomes training data or history rows. Pure. The controller
 * (deciding groups and writing their history rows), `rlq replay` (rebuilding
 * them) and the train job (building the batch) all go through `groupLoad`, so
 * the three readers cannot drift apart: a history row shows exactly the loss
 * mask its sample was trained with.
 */

import type { RunConfig } from "../config/run-config.ts";
import type { LoggedDecision } from "./decisions.ts";
import { maskMinVersion, stalenessRule } from "./staleness.ts";

export type MaskConfig = Pick<RunConfig, "mask_offpolicy_in_partial_rollout" | "max_staleness" | "train_async" | "staleness_policy" | "max_regenerations">;

/** "aborted": a round drained after its step was sealed (discarded with reason "aborted"; its rewards are not read). */
export type LoadOutcome = "kept" | "filtered" | "discarded" | "aborted";

export interface GroupLoad {
  groupId: number;
  /** The round whose rewards are read (a group's rewards are per round). */
  round: number;
  /** mask_offpolicy_in_partial_rollout: tokens of rounds before this one get loss mask 0 (`assembleSample`). */
  maskBeforeRound: number | null;
  /** staleness_policy mask: tokens of versions before this one get loss mask 0 (`maskStale`); kept groups only. */
  minVersion: number | null;
}

/**
 * The one derivation: `round` is the round the group's outcome was decided on
 * (its last verdict; for an aborted round, the round the seal aborted), `step`
 * the step it has its outcome in. Everything generated before that round is
 * off-policy (slime masks it, a finished member's whole response included),
 * except for an aborted round, which is never trained. Stale tokens are masked
 * only in kept groups, against the bound of the step that trains them.
 */
export function groupLoad(config: MaskConfig, g: { groupId: number; round: number; step: number; outcome: LoadOutcome }): GroupLoad {
  const isAborted = g.outcome === "aborted";
  return {
    groupId: g.groupId,
    round: g.round,
    maskBeforeRound: !isAborted && config.mask_offpolicy_in_partial_rollout ? g.round : null,
    minVersion: g.outcome === "kept" ? maskMinVersion(stalenessRule(config), g.step) : null,
  };
}

/** A final outcome (not "buffered") of a group, as recorded, with how its history rows load. */
export interface OutcomeLoad {
  groupId: number;
  step: number;
  outcome: "kept" | "filtered" | "discarded";
  reason: string | null;
  load: GroupLoad;
}

/**
 * Fold a decision log into the final outcomes of its groups, in log order
 * (what `rlq replay` rebuilds `rollout_history` from). A group's round is its
 * latest `group.filtered` before the outcome; an outcome "discarded" with
 * reason "aborted" is a round the seal aborted, and reads that round.
 */
export function outcomeLoads(config: MaskConfig, decisions: readonly LoggedDecision[]): OutcomeLoad[] {
  const roundOf = new Map<number, number>();
  const abortedRound = new Map<number, number>();
  const out: OutcomeLoad[] = [];
  for (const d of decisions) {
    if (d.kind === "group.filtered") roundOf.set(d.payload.groupId, d.payload.round);
    if (d.kind === "step.sealed") for (const a of d.payload.aborted) abortedRound.set(a.groupId, a.round);
    if (d.kind !== "group.outcome" || d.payload.outcome === "buffered") continue;
    const { groupId, step, outcome, reason } = d.payload;
    const isAborted = outcome === "discarded" && reason === "aborted";
    const round = isAborted ? (abortedRound.get(groupId) ?? 0) : (roundOf.get(groupId) ?? 0);
    out.push({ groupId, step, outcome, reason, load: groupLoad(config, { groupId, round, step, outcome: isAborted ? "aborted" : outcome }) });
  }
  return out;
}

/**
 * The loads of a sealed step's batch, in training order (the seal's order).
 * `verdicts` are the step's `group.filtered` decisions in log order: each kept
 * group trains on the round of its last keep verdict of the step. Returns the
 * first kept group without one as `missing` (the batch is inconsistent).
 */
export function stepLoads(
  config: MaskConfig,
  step: number,
  kept: readonly number[],
  verdicts: ReadonlyArray<{ groupId: number; round: number; keep: boolean }>,
): { loads: GroupLoad[]; missing: number | null } {
  const lastKeep = new Map(verdicts.filter((v) => v.keep).map((v) => [v.groupId, v.round]));
  const loads: GroupLoad[] = [];
  for (const groupId of kept) {
    const round = lastKeep.get(groupId);
    if (round === undefined) return { loads, missing: groupId };
    loads.push(groupLoad(config, { groupId, round, step, outcome: "kept" }));
  }
  return { loads, missing: null };
}
