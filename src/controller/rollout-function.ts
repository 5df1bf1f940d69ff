import { LeaseLostError } from "../store/decision-log.ts";
import { findDecisions, insertDrawnPrompts, loadDrawnPrompts } from "../store/run-facts.ts";
import { setRunProjection } from "../store/projections.ts";
import { loadRoundStatuses } from "../store/rollout-facts.ts";
import { loadGroupsWithRewards } from "../store/group-view.ts";
import type { Decision } from "../core/decisions.ts";
import type { DynamicFilterOutput } from "../filters/index.ts";
import {
  deepFreeze,
  loadRolloutFunction,
  type RolloutFunction,
  type RolloutGroup,
  type RolloutSample,
  type RolloutTrainContext,
} from "../rollout/rollout-function-contract.ts";
import { planDraw } from "./draw.ts";
import { CallJournal, type JournalEffects } from "./rollout-journal.ts";
import { enqueueJobsFor } from "./jobs.ts";
import { sealReturn } from "./rollout-function-seal.ts";
import {
  MAX_STUCK_TICKS,
  verdictFor,
  where,
  type Call,
  type CallRecord,
  type Execution,
  type Input,
  type RolloutFunctionDriver,
  type RolloutFunctionHost,
  type SeenGroup,
} from "./rollout-function-host.ts";
import { errorMessage, RlqError } from "../lib/errors.ts";

export type { RolloutFunctionDriver, RolloutFunctionHost } from "./rollout-function-host.ts";

/**
 * rollout_function_path, train branch: the user's `rollout(args, ctx)` plans
 * the collect phase of a sync step (docs/plugins.md). The controller calls
 * `tick()` in place of its built-in collect; the function runs in this
 * process as a planner replayed from the decision log (rollout-journal.ts):
 *
 * - `draw(n)` → `prompts.drawn` + `drawn_prompts` rows (buffer first through
 *   the buffer filter, then the cursor: the built-in draw);
 * - `generate(group)` → `group.dispatched` + the rollout job (its reward job
 *   follows); it resolves once a round finished the group and its rewards are
 *   recorded (an unfinished round is continued as the next one, as built-in);
 * - `filterDynamic(group)` → the run's dynamic filter, its verdict recorded;
 * - `addToBuffer(groups)` → `group.outcome buffered`;
 * - the return → `group.filtered` + `group.outcome` for every group of the
 *   step (kept: the returned ones, in the returned order) and `step.sealed`
 *   (rounds still in flight are aborted and drained as built-in).
 *
 * Each of those commits carries a `rollout_fn.called` record of the call, so
 * a restarted controller re-runs the function and every recorded call returns
 * at once: nothing is drawn or generated twice. Everything downstream (the
 * train job's batch, `rlq replay`, the views) sees the usual decisions.
 * A throw, a bad return, a bad call or non-determinism pauses the run with the
 * reason; nothing recorded is lost and `rlq run resume` replays the function.
 */
export async function createRolloutFunctionDriver(host: RolloutFunctionHost, path: string, baseDir = process.cwd()): Promise<RolloutFunctionDriver> {
  let fn: RolloutFunction;
  try {
    fn = await loadRolloutFunction(path, baseDir);
  } catch (e) {
    // The controller cannot start without it: say why where `rlq run status` shows it.
    await setRunProjection(host.db, host.state().runId, { lastError: errorMessage(e) });
    throw e;
  }
  return new Driver(host, path, fn);
}

class Driver implements RolloutFunctionDriver {
  private exec: Execution | null = null;

  constructor(
    private readonly host: RolloutFunctionHost,
    private readonly path: string,
    private readonly fn: RolloutFunction,
  ) {}

  async tick(): Promise<boolean> {
    const s = this.host.state();
    try {
      if (!this.exec || this.exec.step !== s.step) this.exec = await this.begin(s.step);
      const ex = this.exec;
      const progressed = await ex.journal.advance(this.effects(ex));
      if (ex.fatal) throw ex.fatal;
      const result = ex.journal.result;
      if (result) {
        await sealReturn(this.host, this.path, ex, result);
        this.exec = null;
        return true;
      }
      const idle = !progressed && ex.journal.calls.every((c) => c.outcome !== null);
      ex.stuckTicks = idle ? ex.stuckTicks + 1 : 0;
      if (ex.stuckTicks >= MAX_STUCK_TICKS) {
        throw new RlqError(
          "rollout_fn_blocked",
          `${where(this.path, ex.step)}: the function is waiting on something other than a ctx call (a timer, outside I/O?); it may only await ctx calls`,
        );
      }
      return progressed;
    } catch (e) {
      // Whatever happened, the next tick re-runs the function from the log (replay).
      this.exec = null;
      if (e instanceof LeaseLostError) throw e;
      if (e instanceof RlqError && !e.isRetriable) {
        await this.host.pause(`${e.code}: ${e.message}`);
        return true;
      }
      throw e;
    }
  }

  private async begin(step: number): Promise<Execution> {
    const s = this.host.state();
    const records = await findDecisions(this.host.db, s.runId, "rollout_fn.called", { step });
    const ex: Execution = {
      step,
      journal: new CallJournal<CallRecord, Input>(records, where(this.path, step)),
      seen: new Map(),
      genRound: new Map(),
      verdicts: new Map(),
      fatal: null,
      stuckTicks: 0,
    };
    if (records.length > 0) this.host.log.info({ runId: s.runId, step, calls: records.length }, "replaying the rollout function");
    const ctx = this.context(ex);
    // A copy: the function must not be able to change the run's config under the controller.
    const args = deepFreeze(structuredClone(s.config));
    await ex.journal.start(() => this.fn(args, ctx));
    return ex;
  }

  // ---- ctx: checks happen when the function makes the call (what it has seen so far), so they replay identically.

  private context(ex: Execution): RolloutTrainContext {
    const misuse = (message: string): Promise<never> => {
      const err = new RlqError("plugin_bad_call", `${where(this.path, ex.step)}: ${message}`);
      ex.fatal ??= err;
      return Promise.reject(err);
    };
    const idOf = (g: unknown): number | null => {
      const first = Array.isArray(g) ? (g[0] as unknown) : g;
      const id = first !== null && typeof first === "object" ? (first as { groupId?: unknown }).groupId : undefined;
      return typeof id === "number" && ex.seen.has(id) ? id : null;
    };
    const ctx: RolloutTrainContext = {
      evaluation: false,
      rolloutId: ex.step,
      draw: (n) => {
        if (!Number.isInteger(n) || n < 0) return misuse(`ctx.draw(${String(n)}): expected a non-negative integer`);
        return ex.journal.issue("draw", `n=${n}`, { op: "draw", n }) as Promise<readonly RolloutGroup[]>;
      },
      generate: (g) => {
        const id = idOf(g);
        if (id === null) return misuse("ctx.generate: expected a group from ctx.draw in this step");
        const seen = ex.seen.get(id) as SeenGroup;
        if (seen.phase !== "drawn")
          return misuse(`ctx.generate(group ${id}): the group is ${seen.phase}; only a drawn group (draw it again after addToBuffer) can be generated`);
        ex.seen.set(id, { phase: "generating", group: seen.group });
        return ex.journal.issue("generate", `group=${id}`, { op: "generate", groupId: id }) as Promise<readonly RolloutSample[]>;
      },
      score: (g) => {
        const id = idOf(g);
        const seen = id === null ? null : ex.seen.get(id);
        if (!seen || seen.phase !== "generated")
          return misuse(`ctx.score: expected a group returned by ctx.generate${id === null ? "" : ` (group ${id} is ${seen?.phase})`}`);
        return Promise.resolve(deepFreeze(seen.samples.map((x) => x.reward)));
      },
      filterDynamic: (g) => {
        const id = idOf(g);
        const seen = id === null ? null : ex.seen.get(id);
        if (!seen || seen.phase !== "generated")
          return misuse(`ctx.filterDynamic: expected a group returned by ctx.generate${id === null ? "" : ` (group ${id} is ${seen?.phase})`}`);
        return ex.journal.issue("filter_dynamic", `group=${id}`, {
          op: "filter_dynamic",
          groupId: seen.group.groupId,
          round: seen.round,
          samples: seen.samples,
        }) as Promise<DynamicFilterOutput>;
      },
      addToBuffer: (groups) => {
        if (!Array.isArray(groups)) return misuse("ctx.addToBuffer: expected an array of groups");
        const list: Array<{ groupId: number; round: number | null }> = [];
        for (const g of groups) {
          const id = idOf(g);
          if (id === null) return misuse("ctx.addToBuffer: expected groups from ctx.draw or ctx.generate in this step");
          const seen = ex.seen.get(id) as SeenGroup;
          if (seen.phase !== "drawn" && seen.phase !== "generated")
            return misuse(`ctx.addToBuffer(group ${id}): the group is ${seen.phase}; await its generate first`);
          if (list.some((x) => x.groupId === id)) return misuse(`ctx.addToBuffer: group ${id} is listed twice`);
          list.push({ groupId: id, round: seen.phase === "generated" ? seen.round : null });
        }
        for (const x of list) ex.seen.set(x.groupId, { phase: "buffered", group: (ex.seen.get(x.groupId) as SeenGroup).group });
        return ex.journal.issue("add_to_buffer", `groups=${list.map((x) => x.groupId).join(",")}`, { op: "add_to_buffer", groups: list }) as Promise<void>;
      },
    };
    return Object.freeze(ctx);
  }

  // ---- effects: performed (or replayed) in call order.

  private effects(ex: Execution): JournalEffects<CallRecord, Input> {
    return {
      effect: async (calls) => {
        let batch: Call[] = [];
        for (const c of calls) {
          if (c.op === "generate" && c.record === null) {
            batch.push(c);
            continue;
          }
          if (batch.length > 0) await this.dispatch(ex, batch);
          batch = [];
          await this.effectOne(ex, c);
        }
        if (batch.length > 0) await this.dispatch(ex, batch);
      },
      poll: (calls) =>
        this.poll(
          ex,
          calls.filter((c) => c.op === "generate"),
        ),
      delivered: (c) => {
        if (!c.outcome?.ok) return;
        if (c.op === "draw") {
          for (const g of c.outcome.value as RolloutGroup[]) ex.seen.set(g.groupId, { phase: "drawn", group: g });
        } else if (c.op === "generate") {
          const samples = c.outcome.value as RolloutSample[];
          const id = (c.input as { groupId: number }).groupId;
          ex.seen.set(id, { phase: "generated", group: (ex.seen.get(id) as SeenGroup).group, samples, round: ex.genRound.get(c.ordinal) as number });
        }
      },
    };
  }

  private record(ex: Execution, c: Call, fields: Partial<CallRecord> & { groupIds: number[] }): CallRecord {
    return { step: ex.step, ordinal: c.ordinal, op: c.op, key: c.key, bufferCount: 0, round: null, verdict: null, ...fields };
  }

  private async effectOne(ex: Execution, c: Call): Promise<void> {
    const input = c.input;
    if (input.op === "generate") {
      // A replayed generate: continue from its recorded round.
      ex.genRound.set(c.ordinal, (c.record as CallRecord).round as number);
    } else if (input.op === "draw") {
      if (!c.record) c.record = await this.draw(ex, c, input.n);
      c.outcome = { ok: true, value: await this.groupsOf(c.record) };
    } else if (input.op === "filter_dynamic") {
      if (!c.record) {
        const verdict = await this.host.filter({
          groupId: input.groupId,
          rewards: input.samples.map((x) => x.reward),
          samples: input.samples.map((x) => ({ response: x.response, status: x.status })),
        });
        const rec = this.record(ex, c, { groupIds: [input.groupId], round: input.round, verdict });
        await this.host.commit([{ kind: "rollout_fn.called", payload: rec }]);
        c.record = rec;
      }
      const verdict: DynamicFilterOutput = c.record.verdict ?? { keep: true, reason: null, keep_when_insufficient: false };
      ex.verdicts.set(input.groupId, { round: input.round, verdict });
      c.outcome = { ok: true, value: deepFreeze({ ...verdict }) };
    } else {
      if (!c.record) {
        const rec = this.record(ex, c, { groupIds: input.groups.map((g) => g.groupId) });
        const list: Decision[] = [];
        for (const g of input.groups) {
          if (g.round !== null)
            list.push({ kind: "group.filtered", payload: { groupId: g.groupId, round: g.round, step: ex.step, ...verdictFor(ex, g.groupId, g.round) } });
          list.push({ kind: "group.outcome", payload: { groupId: g.groupId, step: ex.step, outcome: "buffered", reason: "add_to_buffer" } });
        }
        await this.host.commit([...list, { kind: "rollout_fn.called", payload: rec }]);
        c.record = rec;
      }
      c.outcome = { ok: true, value: undefined };
    }
  }

  /** The built-in draw: buffer first through the buffer filter, then the cursor. */
  private async draw(ex: Execution, c: Call, n: number): Promise<CallRecord> {
    const { fromBuffer, draws, cursor, rows } = await planDraw(this.host, this.host.state(), n, ex.step);
    const rec = this.record(ex, c, { groupIds: [...fromBuffer, ...draws.map((d) => d.groupId)], bufferCount: fromBuffer.length });
    await this.host.commit(
      [
        { kind: "prompts.drawn", payload: { step: ex.step, fromBuffer, fresh: draws, cursor } },
        { kind: "rollout_fn.called", payload: rec },
      ],
      async (tx) => {
        await insertDrawnPrompts(tx, rows);
      },
    );
    this.host.crashPoint("rollout_fn.after_draw");
    return rec;
  }

  private async groupsOf(rec: CallRecord): Promise<RolloutGroup[]> {
    if (rec.groupIds.length === 0) return deepFreeze([]);
    const prompts = await loadDrawnPrompts(this.host.db, this.host.state().runId, rec.groupIds);
    return deepFreeze(
      rec.groupIds.map((groupId, i) => {
        const p = prompts.get(groupId);
        if (!p) throw new RlqError("group_not_found", `${where(this.path, rec.step)}: drawn group ${groupId} has no drawn_prompts row`);
        return { groupId, prompt: p.prompt, label: p.label, metadata: p.metadata, isFromBuffer: i < rec.bufferCount };
      }),
    );
  }

  /** New generate calls: their dispatch decisions and records in one commit, then the jobs (outbox). */
  private async dispatch(ex: Execution, calls: Call[]): Promise<void> {
    const s = this.host.state();
    const list: Decision[] = [];
    for (const c of calls) {
      const groupId = (c.input as { groupId: number }).groupId;
      const round = (s.groups.get(groupId)?.round ?? -1) + 1;
      const rec = this.record(ex, c, { groupIds: [groupId], round });
      list.push(
        { kind: "group.dispatched", payload: { groupId, round, step: ex.step, weightVersion: s.weightVersion } },
        { kind: "rollout_fn.called", payload: rec },
      );
      c.record = rec;
      ex.genRound.set(c.ordinal, round);
    }
    await this.host.commit(list);
    this.host.crashPoint("rollout_fn.after_generate");
    await enqueueJobsFor(this.host.queues, s.runId, s.config, list);
  }

  /** Generate calls waiting on a round: finished and scored → the result; ended unfinished → continue as the next round. */
  private async poll(ex: Execution, calls: Call[]): Promise<void> {
    const n = this.host.state().config.n_samples_per_prompt;
    for (let pass = 0; pass < 100 && calls.length > 0; pass++) {
      // Each pass reads the state the previous pass's continued rounds committed.
      const s = this.host.state();
      const keys = calls.map((c) => ({ c, groupId: (c.input as { groupId: number }).groupId, round: ex.genRound.get(c.ordinal) as number }));
      const statuses = await loadRoundStatuses(this.host.db, s.runId, keys);
      const ready: typeof keys = [];
      const redo: typeof keys = [];
      let moved = false;
      for (const k of keys) {
        const st = statuses.get(k.groupId);
        if (!st) continue;
        if (st.isComplete) {
          if (st.rewardCount >= n) ready.push(k);
        } else if ((s.groups.get(k.groupId)?.round ?? k.round) > k.round) {
          // Continued in an earlier life of the controller: follow it.
          ex.genRound.set(k.c.ordinal, k.round + 1);
          moved = true;
        } else {
          redo.push(k);
        }
      }
      if (ready.length > 0) {
        const views = await loadGroupsWithRewards(
          this.host.db,
          s.runId,
          ready.map((k) => ({ groupId: k.groupId, round: k.round, maskBeforeRound: null })),
          n,
        );
        for (const k of ready) {
          const g = views.get(k.groupId);
          if (!g) continue;
          const samples: RolloutSample[] = g.samples.map((x) => {
            const r = g.rewards.get(x.sampleIndex);
            return {
              groupId: k.groupId,
              sampleIndex: x.sampleIndex,
              round: k.round,
              prompt: g.prompt.prompt,
              label: g.prompt.label,
              metadata: g.prompt.metadata,
              response: this.host.tokenizer.decode(x.responseTokens),
              responseTokens: x.responseTokens,
              status: x.status,
              finishReason: x.finishReason,
              reward: r?.reward ?? 0,
              rewardComponents: r?.components ?? {},
              weightVersions: x.weightVersions,
            };
          });
          k.c.outcome = { ok: true, value: deepFreeze(samples) };
        }
      }
      if (redo.length > 0) {
        // A round that ended unfinished without a seal (engine abort or failure): continue it, as built-in.
        const next: Decision[] = redo.map((k) => ({
          kind: "group.dispatched",
          payload: { groupId: k.groupId, round: k.round + 1, step: ex.step, weightVersion: s.weightVersion },
        }));
        await this.host.commit(next);
        for (const k of redo) ex.genRound.set(k.c.ordinal, k.round + 1);
        await enqueueJobsFor(this.host.queues, s.runId, s.config, next);
      }
      if (!moved) return;
      calls = calls.filter((c) => c.outcome === null);
    }
  }
}
