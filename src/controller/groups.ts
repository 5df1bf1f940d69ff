import { loadRoundStatuses } from "../store/rollout-facts.ts";
import { loadGroupsWithRewards } from "../store/group-view.ts";
import { historyRows } from "../store/history.ts";
import { insertDrawnPrompts } from "../store/run-facts.ts";
import { insertHistory } from "../store/projections.ts";
import { overSamplingBatchSize } from "../config/run-config.ts";
import { decideGroups, dispatchDecision, type ReadyGroup } from "../core/decide-groups.ts";
import { groupLoad } from "../core/group-load.ts";
import { maskStale } from "../core/sample.ts";
import { judgeStaleness, stalenessRule } from "../core/staleness.ts";
import type { Decision } from "../core/decisions.ts";
import { planDraw } from "./draw.ts";
import type { ControllerHost } from "./host.ts";

/**
 * The collect phase's I/O, shared by the sync step and the async pipeline:
 * which rounds landed, deciding completed groups (core/decide-groups.ts),
 * drawing and dispatching. The decisions themselves are made in core/.
 */
export type RoundKey = { groupId: number; round: number };

/** The current round of each in-flight group. */
export function inflightRounds(h: ControllerHost): RoundKey[] {
  const s = h.state;
  return [...s.inflight].map((groupId) => ({ groupId, round: s.groups.get(groupId)?.round ?? 0 }));
}

/** Every group generating or aborted-and-not-landed, with its current round. */
export function liveRounds(h: ControllerHost): RoundKey[] {
  const s = h.state;
  return [...inflightRounds(h), ...[...s.draining].map(([groupId, round]) => ({ groupId, round }))];
}

/**
 * The version a live group's current round, not landed yet, was dispatched at: the engines' version, except during an
 * abort-mode sync that dispatches early (async-pipeline.ts `continueDuringSync`). There every round
 * of the old version that had not landed was aborted (it is draining), so a round in flight that has
 * not landed was dispatched during the sync, at the version it loads.
 */
export function unlandedDispatchVersion(h: ControllerHost, groupId: number): number {
  const s = h.state;
  const isEarly = s.syncing !== null && h.engines.isEarlyDispatch && s.config.weight_update_mode === "abort";
  return isEarly && s.syncing && s.inflight.has(groupId) ? s.syncing.weightVersion : s.weightVersion;
}

/**
 * Of these rounds, the landed ones: complete with every reward in (ready to
 * decide), or unfinished (aborted or an engine failure: `redo` holds the
 * round that continues them). Rounds still generating are in neither.
 */
export async function landedRounds(h: ControllerHost, keys: readonly RoundKey[]): Promise<{ ready: number[]; redo: RoundKey[]; unlanded: Set<number> }> {
  const n = h.state.config.n_samples_per_prompt;
  const statuses = await loadRoundStatuses(h.deps.db, h.state.runId, keys);
  const ready: number[] = [];
  const redo: RoundKey[] = [];
  const unlanded = new Set<number>();
  for (const k of keys) {
    const st = statuses.get(k.groupId);
    if (!st) {
      unlanded.add(k.groupId);
      continue;
    }
    if (!st.isComplete) redo.push({ groupId: k.groupId, round: k.round + 1 });
    else if (st.rewardCount >= n) ready.push(k.groupId);
  }
  return { ready, redo, unlanded };
}

/**
 * Filter completed group rounds (in the given order) and record their
 * outcomes, in one transaction: one bulk load, the filter plugin per group,
 * the pure decision (`decideGroups`), one commit with the history rows.
 */
export async function decideReady(h: ControllerHost, ready: readonly number[]): Promise<void> {
  if (ready.length === 0) return;
  const s = h.state;
  const c = s.config;
  const keys = ready.map((groupId) => groupLoad(c, { groupId, round: s.groups.get(groupId)?.round ?? 0, step: s.step, outcome: "kept" }));
  const views = await loadGroupsWithRewards(h.deps.db, s.runId, keys, c.n_samples_per_prompt);
  const decode = (ids: readonly number[]) => h.ctx.tokenizer.decode(ids);
  const groups: ReadyGroup[] = [];
  for (const { groupId, round } of keys) {
    const g = views.get(groupId);
    if (!g) continue;
    const rewards = g.samples.map((x) => g.rewards.get(x.sampleIndex)?.reward ?? 0);
    const verdict = await h.filter({ groupId, rewards, samples: g.samples.map((x) => ({ response: decode(x.responseTokens), status: x.status })) });
    groups.push({ groupId, round, samples: g.samples, verdict });
  }
  const decided = decideGroups(s, groups);
  const rows = decided.outcomes.flatMap((o) => {
    const g = views.get(o.groupId);
    if (!g) return [];
    const view = { ...g, samples: g.samples.map((x) => maskStale(x, o.load.minVersion)) };
    return historyRows(s.runId, o.step, view, g.rewards, o.outcome, o.reason, decode, null);
  });
  await h.commitThenEnqueue(decided.decisions, { extra: (tx) => insertHistory(tx, rows) });
}

/** Draw `want` groups (buffer first, then fresh prompts) and dispatch them, in one commit; then their rollout jobs. */
export async function drawAndDispatch(h: ControllerHost, want = overSamplingBatchSize(h.state.config), weightVersion = h.state.weightVersion): Promise<void> {
  const s = h.state;
  const { fromBuffer, draws, cursor, rows } = await planDraw({ dataset: h.dataset, tokenizer: h.ctx.tokenizer, bufferFilter: h.bufferFilter }, s, want, s.step);
  const dispatches = [
    ...fromBuffer.map((groupId) => ({ groupId, round: (s.groups.get(groupId)?.round ?? -1) + 1 })),
    ...draws.map((d) => ({ groupId: d.groupId, round: 0 })),
  ];
  const list: Decision[] = [
    { kind: "prompts.drawn", payload: { step: s.step, fromBuffer, fresh: draws, cursor } },
    ...(await cutStaleBuffered(h, fromBuffer)),
    ...dispatches.map((d) => dispatchDecision(s, d.groupId, d.round, weightVersion)),
  ];
  await h.commitThenEnqueue(list, { extra: (tx) => insertDrawnPrompts(tx, rows), crashPoint: "controller.after_draw" });
}

/**
 * staleness_policy drop: a buffered group resuming in this step with samples
 * already too stale for it is cut before it resumes (they regenerate from the
 * prompt), rather than continued and cut when it completes. Groups out of
 * regenerations resume as they are and are discarded when they complete.
 */
async function cutStaleBuffered(h: ControllerHost, fromBuffer: readonly number[]): Promise<Decision[]> {
  const s = h.state;
  const c = s.config;
  const rule = stalenessRule(c);
  if (fromBuffer.length === 0 || rule.policy !== "drop" || rule.maxStaleness === null) return [];
  const keys = fromBuffer.map((groupId) => ({ groupId, round: -1, maskBeforeRound: null }));
  const views = await loadGroupsWithRewards(h.deps.db, s.runId, keys, c.n_samples_per_prompt);
  const out: Decision[] = [];
  for (const groupId of fromBuffer) {
    const g = views.get(groupId);
    const st = s.groups.get(groupId);
    if (!g || !st) continue;
    // With mask_offpolicy the resumed round masks everything before it: nothing earlier is trained, nothing is stale.
    if (c.mask_offpolicy_in_partial_rollout) continue;
    const verdict = judgeStaleness(g.samples, s.step, rule, st.regenerations);
    if (verdict.kind === "cut")
      out.push({ kind: "group.cut", payload: { groupId, step: s.step, round: st.round + 1, samples: verdict.samples, reason: verdict.reason } });
  }
  return out;
}

/** Continue rounds that ended unfinished without a seal (engine abort or failure) as new rounds. */
export async function dispatchRounds(h: ControllerHost, list: readonly RoundKey[], weightVersion = h.state.weightVersion): Promise<void> {
  await h.commitThenEnqueue(list.map((d) => dispatchDecision(h.state, d.groupId, d.round, weightVersion)));
}
