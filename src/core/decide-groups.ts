/**
 * Deciding completed groups (docs/architecture.md "The loop", steps 4 and 5): the filter's verdict,
 * the staleness rule, the step a group joins and, in async mode, the seals.
 * Pure: the controller calls the filter plugin and loads the groups, then
 * commits what this returns.
 */

import { shouldDropDynamicFilterOutput, type DynamicFilterOutput } from "../filters/dynamic-filter.ts";
import type { Decision } from "./decisions.ts";
import { groupLoad, type OutcomeLoad } from "./group-load.ts";
import { isAsync, totalSteps, type RunState } from "./run-state.ts";
import type { AssembledSample } from "./sample.ts";
import { judgeStaleness, stalenessRule } from "./staleness.ts";

export interface ReadyGroup {
  groupId: number;
  /** The round that completed (all its rewards in). */
  round: number;
  /** Its samples, assembled with `groupLoad`'s `maskBeforeRound` for this round. */
  samples: readonly AssembledSample[];
  /** The dynamic filter's verdict on the round. */
  verdict: DynamicFilterOutput;
}

export interface GroupsDecided {
  decisions: Decision[];
  /** Final outcomes whose history rows are written with the decisions, in order. */
  outcomes: OutcomeLoad[];
  /** Rounds dispatched by these decisions (drop policy cuts): their rollout jobs follow the commit. */
  regenerate: Array<{ groupId: number; round: number }>;
}

/** The dispatch of a group's round in the current step, at the engines' version. */
/** `weightVersion`: the engines' version, or during an abort-mode sync the version it loads (controller/async-pipeline.ts). */
export function dispatchDecision(s: RunState, groupId: number, round: number, weightVersion = s.weightVersion): Decision {
  return { kind: "group.dispatched", payload: { groupId, round, step: s.step, weightVersion } };
}

/**
 * Filter completed group rounds (in the given order) and decide their
 * outcomes. Sync mode: every group joins the current step. Async mode: each
 * joins the earliest unsealed step, and a step is sealed (and the next one
 * started) as soon as it holds rollout_batch_size groups. The staleness rule
 * is applied at the join: drop cuts stale samples (the group regenerates
 * them in a new round, dispatched in the same commit).
 */
export function decideGroups(s: RunState, ready: readonly ReadyGroup[]): GroupsDecided {
  const c = s.config;
  const rule = stalenessRule(c);
  const async = isAsync(s);
  const total = totalSteps(s);
  let step = s.step;
  let keptInStep = [...s.kept];
  // slime: remaining = groups still able to count (kept + in flight, this one included).
  let remaining = s.kept.length + s.inflight.size + (async ? s.draining.size : 0);
  const decisions: Decision[] = [];
  const outcomes: OutcomeLoad[] = [];
  const regenerate: Array<{ groupId: number; round: number }> = [];
  for (const { groupId, round, samples, verdict } of ready) {
    let outcome: "kept" | "filtered" | "buffered" | "discarded";
    let reason: string | null = null;
    if (!verdict.keep && shouldDropDynamicFilterOutput(verdict, { remainingBatchSize: remaining, targetDataSize: c.rollout_batch_size })) {
      outcome = "filtered";
      reason = verdict.reason ?? "filtered";
      remaining--;
    } else if (keptInStep.length < c.rollout_batch_size && step < total) {
      const stale = judgeStaleness(samples, step, rule, s.groups.get(groupId)?.regenerations ?? 0);
      if (stale.kind === "cut") {
        // The group stays in flight: its stale samples regenerate from the prompt in the next round.
        decisions.push(
          { kind: "group.filtered", payload: { groupId, round, step, keep: true, reason: verdict.reason ?? null } },
          { kind: "group.cut", payload: { groupId, step, round: round + 1, samples: stale.samples, reason: stale.reason } },
          dispatchDecision(s, groupId, round + 1),
        );
        regenerate.push({ groupId, round: round + 1 });
        continue;
      }
      if (stale.kind === "discard") {
        outcome = "discarded";
        reason = stale.reason;
        remaining--;
      } else {
        outcome = "kept";
        keptInStep.push(groupId);
      }
    } else {
      outcome = c.partial_rollout && !async ? "buffered" : "discarded";
      reason = "surplus";
    }
    if (outcome !== "buffered") outcomes.push({ groupId, step, outcome, reason, load: groupLoad(c, { groupId, round, step, outcome }) });
    decisions.push(
      { kind: "group.filtered", payload: { groupId, round, step, keep: outcome !== "filtered", reason: verdict.reason ?? null } },
      { kind: "group.outcome", payload: { groupId, step, outcome, reason } },
    );
    if (async && keptInStep.length >= c.rollout_batch_size) {
      decisions.push({ kind: "step.sealed", payload: { step, kept: [...keptInStep].sort((a, b) => a - b), aborted: [] } });
      if (step + 1 < total) decisions.push({ kind: "step.started", payload: { step: step + 1, weightVersion: s.weightVersion } });
      step++;
      keptInStep = [];
    }
  }
  return { decisions, outcomes, regenerate };
}

/**
 * Sync mode: with rollout_batch_size groups kept, the step is sealed. The
 * seal lists the kept groups in draw order (the training order) and the
 * rounds still in flight, which are aborted. Null: not full yet.
 */
export function sealDecision(s: RunState): Decision | null {
  if (s.kept.length < s.config.rollout_batch_size) return null;
  const aborted = [...s.inflight].sort((a, b) => a - b).map((groupId) => ({ groupId, round: s.groups.get(groupId)?.round ?? 0 }));
  return { kind: "step.sealed", payload: { step: s.step, kept: [...s.kept].sort((a, b) => a - b), aborted } };
}

/**
 * Sync mode: whether another over-sampling batch is drawn (kept + in flight
 * cannot fill the batch; deterministic mode draws only with nothing in flight).
 */
export function shouldDrawMore(s: RunState): boolean {
  const c = s.config;
  return s.kept.length + s.inflight.size < c.rollout_batch_size && (!c.deterministic || s.inflight.size === 0);
}
