import { findDecisions } from "../store/run-facts.ts";
import { loadGroupsWithRewards } from "../store/group-view.ts";
import { historyRows } from "../store/history.ts";
import { insertHistory } from "../store/projections.ts";
import type { Decision } from "../core/decisions.ts";
import { groupLoad } from "../core/group-load.ts";
import { maskStale } from "../core/sample.ts";
import { badReturn, trainOutputSchema, zodDetail } from "../rollout/rollout-function-contract.ts";
import type { CallJournal } from "./rollout-journal.ts";
import { errorMessage, RlqError } from "../lib/errors.ts";
import { verdictFor, where, type CallRecord, type Execution, type Input, type RolloutFunctionHost, type SeenGroup } from "./rollout-function-host.ts";

/**
 * The function returned: the step's outcomes and its seal, in one commit.
 * A throw or a bad return pauses the run (the caller does).
 */
export async function sealReturn(
  host: RolloutFunctionHost,
  path: string,
  ex: Execution,
  result: NonNullable<CallJournal<CallRecord, Input>["result"]>,
): Promise<void> {
  if (!result.ok) {
    const e = result.error;
    if (e instanceof RlqError && !e.isRetriable) throw e;
    throw new RlqError("plugin_threw", `${where(path, ex.step)}: the function threw: ${errorMessage(e)}`, { cause: e });
  }
  ex.journal.checkReplayComplete();
  const s = host.state();
  const c = s.config;
  const { kept, metrics } = validate(host, path, ex, result.value);
  const keptSet = new Set(kept);
  const list: Decision[] = [];
  const historyKeys: Array<{ groupId: number; round: number; outcome: "kept" | "filtered" | "discarded"; reason: string | null }> = [];
  const generated = [...ex.seen.values()].filter((g): g is Extract<SeenGroup, { phase: "generated" }> => g.phase === "generated");
  const byId = new Map(generated.map((g) => [g.group.groupId, g]));
  for (const id of kept) {
    const g = byId.get(id) as Extract<SeenGroup, { phase: "generated" }>;
    const v = verdictFor(ex, id, g.round);
    list.push({ kind: "group.filtered", payload: { groupId: id, round: g.round, step: ex.step, keep: true, reason: v.reason } });
    list.push({ kind: "group.outcome", payload: { groupId: id, step: ex.step, outcome: "kept", reason: null } });
    historyKeys.push({ groupId: id, round: g.round, outcome: "kept", reason: null });
  }
  for (const g of generated.filter((x) => !keptSet.has(x.group.groupId)).sort((a, b) => a.group.groupId - b.group.groupId)) {
    const id = g.group.groupId;
    const v = verdictFor(ex, id, g.round);
    const outcome = v.keep ? "discarded" : "filtered";
    const reason = v.keep ? "not_returned" : (v.reason ?? "filtered");
    list.push({ kind: "group.filtered", payload: { groupId: id, round: g.round, step: ex.step, keep: v.keep, reason: v.reason } });
    list.push({ kind: "group.outcome", payload: { groupId: id, step: ex.step, outcome, reason } });
    historyKeys.push({ groupId: id, round: g.round, outcome, reason });
  }
  // Drawn and never generated: discarded (addToBuffer keeps a group for later). Their history row
  // uses the group's last judged round, as `rlq replay` does.
  const unused = [...ex.seen.values()]
    .filter((g) => g.phase === "drawn")
    .map((g) => g.group.groupId)
    .sort((a, b) => a - b);
  for (const id of unused) {
    const judged = await findDecisions(host.db, s.runId, "group.filtered", { groupId: id });
    list.push({ kind: "group.outcome", payload: { groupId: id, step: ex.step, outcome: "discarded", reason: "unused" } });
    historyKeys.push({ groupId: id, round: judged[judged.length - 1]?.round ?? 0, outcome: "discarded", reason: "unused" });
  }
  // Generations the function did not wait for: aborted with the seal, then buffered or discarded by the drain.
  const aborted = [...ex.seen.values()]
    .filter((g) => g.phase === "generating")
    .map((g) => ({ groupId: g.group.groupId, round: s.groups.get(g.group.groupId)?.round ?? 0 }))
    .sort((a, b) => a.groupId - b.groupId);
  list.push({ kind: "step.sealed", payload: { step: ex.step, kept, aborted } });

  const rows: Parameters<typeof insertHistory>[1] = [];
  for (const k of historyKeys) {
    // The history rows load as the train job and `rlq replay` load them (core/group-load.ts).
    const load = groupLoad(c, { ...k, step: ex.step });
    const view = (await loadGroupsWithRewards(host.db, s.runId, [load], c.n_samples_per_prompt)).get(k.groupId);
    if (!view) continue;
    const masked = { ...view, samples: view.samples.map((x) => maskStale(x, load.minVersion)) };
    rows.push(...historyRows(s.runId, ex.step, masked, view.rewards, k.outcome, k.reason, (ids) => host.tokenizer.decode(ids), null));
  }
  host.crashPoint("rollout_fn.before_seal");
  await host.commit(list, (tx) => insertHistory(tx, rows));
  host.log.info({ runId: s.runId, step: ex.step, kept: kept.length, calls: ex.journal.calls.length, metrics }, "rollout function sealed the step");
  host.crashPoint("controller.after_seal");
}

/** The returned groups: exactly rollout_batch_size groups of n_samples_per_prompt samples, each generated in this step. */
function validate(host: RolloutFunctionHost, path: string, ex: Execution, value: unknown): { kept: number[]; metrics: Record<string, number> | null } {
  const c = host.state().config;
  const rbs = c.rollout_batch_size;
  const n = c.n_samples_per_prompt;
  const bad = (detail: string) => badReturn(path, ex.step, false, detail);
  const parsed = trainOutputSchema.safeParse(value);
  if (!parsed.success) {
    throw bad(
      `${describe(value)}; expected {samples: Sample[][], metrics?} (or Sample[][]): rollout_batch_size (${rbs}) groups from ctx.generate (${zodDetail(parsed.error)})`,
    );
  }
  const groups = parsed.data.samples;
  if (groups.length !== rbs) throw bad(`${groups.length} group(s); expected exactly rollout_batch_size = ${rbs} groups of n_samples_per_prompt = ${n} samples`);
  const ids: number[] = [];
  for (const [i, group] of groups.entries()) {
    const id = group[0]?.groupId;
    if (group.length !== n || id === undefined) throw bad(`group #${i} with ${group.length} sample(s); expected n_samples_per_prompt = ${n}`);
    if (ids.includes(id)) throw bad(`group ${id} twice`);
    const seen = ex.seen.get(id);
    if (!seen || seen.phase !== "generated") {
      throw bad(
        `group ${id}, which ${seen ? `is ${seen.phase}` : "was not drawn"} in this step; every returned group must come from an awaited ctx.generate of this step`,
      );
    }
    const indices = new Set<number>();
    for (const x of group) {
      const rec = seen.samples[x.sampleIndex];
      if (x.groupId !== id || !rec || indices.has(x.sampleIndex))
        throw bad(`group #${i} mixing groups or repeating samples (group ${x.groupId} sample ${x.sampleIndex}); return the groups ctx.generate gave`);
      indices.add(x.sampleIndex);
      if ((x.reward !== undefined && x.reward !== rec.reward) || (x.response !== undefined && x.response !== rec.response)) {
        throw bad(
          `group ${id} sample ${x.sampleIndex} with an edited reward or response; rlq trains on the recorded samples (change rewards with custom_rm_path)`,
        );
      }
    }
    ids.push(id);
  }
  return { kept: ids, metrics: parsed.data.metrics ?? null };
}

function describe(value: unknown): string {
  if (value === undefined) return "undefined";
  const text = JSON.stringify(value);
  return text === undefined ? typeof value : text.length > 120 ? `${text.slice(0, 120)}…` : text;
}
