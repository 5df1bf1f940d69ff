/**
 * `rlq replay`: rebuild every projection of a run from its facts alone
 * (decisions, segments, rewards, train steps), without calling any plugin:
 * what a plugin decided is itself a recorded decision. `--check` compares
 * with the live projections instead of writing.
 */

import { maskStale } from "../core/sample.ts";
import { outcomeLoads } from "../core/group-load.ts";
import type { Db } from "../store/db.ts";
import { loadDecisions } from "../store/decision-log.ts";
import { loadGroupWithRewards } from "../store/group-view.ts";
import { historyRows, loadHistory } from "../store/history.ts";
import { diffStepSummaries, replaceProjections, type HistoryRow } from "../store/projections.ts";
import { loadRunRow } from "../store/run-facts.ts";
import { listTrainSteps } from "../store/train-facts.ts";
import { fold } from "../core/run-state.ts";
import type { RunContext } from "../runtime/run-context.ts";

export interface ReplayResult {
  runId: string;
  decisions: number;
  historyRows: number;
  differences: string[];
}

async function rebuild(db: Db, ctx: RunContext) {
  const decisions = await loadDecisions(db, ctx.runId);
  const state = fold(ctx.runId, decisions);
  const trained = new Map((await listTrainSteps(db, ctx.runId)).map((t) => [t.step, t]));
  const rows: HistoryRow[] = [];
  for (const o of outcomeLoads(state.config, decisions)) {
    const { groupId, round, maskBeforeRound, minVersion } = o.load;
    const loaded = await loadGroupWithRewards(db, ctx.runId, groupId, round, state.config.n_samples_per_prompt, maskBeforeRound);
    const g = { ...loaded, samples: loaded.samples.map((x) => maskStale(x, minVersion)) };
    const trainedStep = o.outcome === "kept" && trained.has(o.step) ? o.step : null;
    // An aborted round is drained, never judged: it has no rewards of its own.
    const isAborted = o.outcome === "discarded" && o.reason === "aborted";
    rows.push(...historyRows(ctx.runId, o.step, g, isAborted ? null : g.rewards, o.outcome, o.reason, (ids) => ctx.tokenizer.decode(ids), trainedStep));
  }
  const committed = [...trained.keys()];
  const runRow = {
    status: state.status,
    step: committed.length === 0 ? 0 : Math.max(...committed) + 1,
    weightVersion: state.weightVersion,
    lastSeq: state.seq,
  };
  return { decisions: decisions.length, rows, runRow };
}

const key = (r: { groupId: number; sampleIndex: number }) => `${r.groupId}/${r.sampleIndex}`;

function normalise(r: HistoryRow): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(r)) {
    if (k === "rolloutLogProbs" && Array.isArray(v)) out[k] = v.map((x: number) => Math.fround(x));
    else if (k === "rewardComponents") out[k] = JSON.stringify(v ?? null);
    else out[k] = v ?? null;
  }
  return out;
}

export async function replayRun(db: Db, ctx: RunContext, options: { check: boolean }): Promise<ReplayResult> {
  const built = await rebuild(db, ctx);
  const differences: string[] = [];
  if (options.check) {
    const live = await loadHistory(db, ctx.runId);
    const want = new Map(built.rows.map((r) => [key(r as { groupId: number; sampleIndex: number }), normalise(r)]));
    const have = new Map(live.map((r) => [key(r), normalise(r as HistoryRow)]));
    for (const [k, w] of want) {
      const h = have.get(k);
      if (!h) {
        differences.push(`rollout_history ${k}: missing from the live projection`);
        continue;
      }
      for (const col of Object.keys(w)) {
        if (JSON.stringify(w[col]) !== JSON.stringify(h[col]))
          differences.push(`rollout_history ${k}.${col}: live ${JSON.stringify(h[col])?.slice(0, 80)} != replayed ${JSON.stringify(w[col])?.slice(0, 80)}`);
      }
    }
    for (const k of have.keys()) if (!want.has(k)) differences.push(`rollout_history ${k}: in the live projection but not in the facts`);
    const run = await loadRunRow(db, ctx.runId);
    for (const [col, v] of Object.entries(built.runRow)) {
      const h = (run as Record<string, unknown> | undefined)?.[col];
      if (h !== v) differences.push(`runs.${col}: live ${JSON.stringify(h)} != replayed ${JSON.stringify(v)}`);
    }
    // The summaries follow the history: compared only once the history itself agrees.
    if (differences.length === 0) differences.push(...(await diffStepSummaries(db, ctx.runId)));
  } else {
    await replaceProjections(db, ctx.runId, built.rows, built.runRow);
  }
  return { runId: ctx.runId, decisions: built.decisions, historyRows: built.rows.length, differences };
}
