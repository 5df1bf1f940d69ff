import { pathToFileURL } from "node:url";
import type { Db, Database } from "../store/db.ts";
import { appendDecisions, LeaseLostError, tryAcquireLease, type Lease } from "../store/decision-log.ts";
import { loadRunState, saveRunSnapshot, SNAPSHOT_EVERY_DECISIONS } from "../store/run-snapshots.ts";
import { insertDrawnPrompts, projectRunInTx, setRunProjection } from "../store/run-facts.ts";
import { loadRoundStatuses } from "../store/rollout-facts.ts";
import { loadGroupsWithRewards } from "../store/group-view.ts";
import { historyRows, insertHistory } from "../store/history.ts";
import { loadTrainStep } from "../store/train-facts.ts";
import { loadEvalResults } from "../store/eval-facts.ts";
import { markRunRequest, pendingRunRequests } from "../store/run-requests.ts";
import type { JobInfo, Queues } from "../queue/queues.ts";
import { jobIds, UNRECOVERABLE_PREFIX, type JobData, type QueueKind } from "../queue/payloads.ts";
import { amendableKeys, effectiveMaxStaleness, overSamplingBatchSize, parseRunConfig } from "../config/run-config.ts";
import { apply, isAsync, totalSteps, type RunState } from "../core/run-state.ts";
import { maskStale } from "../core/sample.ts";
import { judgeStaleness, maskMinVersion, stalenessRule } from "../core/staleness.ts";
import type { Decision } from "../core/decisions.ts";
import type { Dataset } from "../data/dataset.ts";
import { loadRunDataset } from "../runtime/plugins-registry.ts";
import { createBufferFilter, createDynamicFilter, shouldDrop, type BufferFilter, type DynamicFilter } from "../runtime/filters.ts";
import type { RunContext, RunContextCache } from "../runtime/run-context.ts";
import { createEngineAdmin, type EngineAdmin } from "./engine-admin.ts";
import { planDraw } from "./draw.ts";
import { checkFingerprints } from "./fingerprints.ts";
import { createRolloutFunctionDriver, type RolloutFunctionDriver } from "./rollout-function.ts";
import type { Logger } from "../observability/logger.ts";
import { errorMessage, RlqError } from "../lib/errors.ts";
import { sleep } from "../lib/sleep.ts";

/**
 * The per-run controller (DESIGN §1, sync mode). It holds the run's lease,
 * folds the decision log into state, and drives one step at a time:
 * collect (draw, dispatch, filter completed groups) → seal → drain (aborted
 * rounds back to the buffer or discarded) → train → sync → next step.
 * Every decision is committed before its job is enqueued (outbox); on start,
 * periodically, and whenever the queue's sentinel vanished it reconciles the
 * queues with what the state expects.
 */
export interface ControllerDeps {
  db: Db;
  queues: Queues;
  contexts: RunContextCache;
  log: Logger;
  holder: string;
  crashPoint(name: string): void;
  pollMs?: number;
  reconcileMs?: number;
  engineAdmin?: (ctx: RunContext) => EngineAdmin;
}

export type ControllerExit = "completed" | "cancelled" | "stopped" | "lease_lost";

export async function runController(deps: ControllerDeps, runId: string, signal: AbortSignal): Promise<ControllerExit> {
  let lease: Lease | null = null;
  while (!signal.aborted) {
    lease = await tryAcquireLease(deps.db, runId, deps.holder);
    if (lease) break;
    // Standby: another controller holds the run.
    await sleep(1000, signal);
  }
  if (!lease) return "stopped";
  const leaseLost = { value: false };
  void lease.lost.then(() => {
    leaseLost.value = true;
  });
  try {
    const c = await RunController.start(deps, lease);
    try {
      return await c.loop(signal, leaseLost);
    } finally {
      await c.close();
    }
  } catch (e) {
    if (e instanceof LeaseLostError) return "lease_lost";
    throw e;
  } finally {
    await lease.release();
  }
}

class RunController {
  private lastReconcile = 0;
  /** rollout_function_path: the user's planner runs the collect phase (rollout-function.ts). */
  private rolloutFunction: RolloutFunctionDriver | null = null;
  /** seq of the run's latest snapshot (store/run-snapshots.ts; -1: none). */
  private snapshotSeq = -1;

  private constructor(
    private readonly deps: ControllerDeps,
    private readonly lease: Lease,
    private state: RunState,
    private readonly ctx: RunContext,
    private readonly dataset: Dataset,
    private readonly filter: DynamicFilter,
    private readonly bufferFilter: BufferFilter,
    private readonly engines: EngineAdmin,
  ) {}

  static async start(deps: ControllerDeps, lease: Lease): Promise<RunController> {
    const t0 = Date.now();
    // The latest snapshot and the decisions after it: the same state as folding the whole log.
    const { state, fromSnapshotSeq } = await loadRunState(deps.db, lease.runId);
    const ctx = await deps.contexts.get(lease.runId);
    const c = state.config;
    const { dataset } = await loadRunDataset(c, ctx.tokenizer);
    await checkFingerprints(deps.db, state, dataset);
    const ctl = new RunController(
      deps,
      lease,
      state,
      ctx,
      dataset,
      await createDynamicFilter(c, process.cwd()),
      await createBufferFilter(c, process.cwd()),
      (deps.engineAdmin ?? createEngineAdmin.bind(null, c))(ctx),
    );
    ctl.snapshotSeq = fromSnapshotSeq;
    if (c.rollout_function_path !== null) {
      ctl.rolloutFunction = await createRolloutFunctionDriver(
        {
          db: deps.db,
          queues: deps.queues,
          log: deps.log,
          crashPoint: (name) => deps.crashPoint(name),
          state: () => ctl.state,
          commit: (list, extra) => ctl.commit(list, extra),
          pause: (reason) => ctl.pause(reason),
          dataset,
          tokenizer: ctx.tokenizer,
          filter: ctl.filter,
          bufferFilter: ctl.bufferFilter,
        },
        c.rollout_function_path,
      );
    }
    if (isAsync(state) && !c.use_tis && !c.use_rollout_logprobs) {
      deps.log.warn(
        { runId: lease.runId },
        "train_async without use_tis: samples one or more versions stale are trained without importance correction (on the demo task k = 1 without TIS unlearns; see bench/results/async-pipeline.json)",
      );
    }
    await deps.queues.ensureSentinel(lease.runId);
    await ctl.resyncEngines();
    await ctl.reconcile(false);
    deps.log.info(
      { runId: lease.runId, epoch: lease.epoch, seq: state.seq, step: state.step, phase: state.phase, ms: Date.now() - t0 },
      "controller took the run",
    );
    return ctl;
  }

  async close(): Promise<void> {
    await this.engines.close().catch(() => undefined);
  }

  async loop(signal: AbortSignal, leaseLost: { value: boolean }): Promise<ControllerExit> {
    const pollMs = this.deps.pollMs ?? 100;
    while (!signal.aborted) {
      if (leaseLost.value) return "lease_lost";
      await this.handleRequests();
      const s = this.state.status;
      if (s === "completed") return "completed";
      if (s === "cancelled") return "cancelled";
      let progressed = false;
      if (s === "running") {
        if (!(await this.deps.queues.ensureSentinel(this.state.runId))) {
          this.deps.log.warn({ runId: this.state.runId }, "queue state was lost (sentinel missing): reconciling");
          await this.reconcile(false);
        } else if (Date.now() - this.lastReconcile > (this.deps.reconcileMs ?? 5000)) {
          await this.reconcile(false);
        }
        progressed = await this.tick();
      }
      if (!progressed) await sleep(pollMs, signal);
    }
    return "stopped";
  }

  /**
   * A restarted controller cannot know what remote engines serve (another run
   * or an operator may have loaded other weights): load the run's current
   * committed version before dispatching anything.
   */
  async resyncEngines(): Promise<void> {
    const s = this.state;
    const uri = s.weightVersion === 0 ? (s.config.ref_load ? pathToFileURL(s.config.ref_load).href : null) : s.checkpointUri;
    if (uri) {
      await this.engines.loadWeights(s.weightVersion, uri);
      return;
    }
    // Version 0 with nothing to load: the engines must still serve their base weights. An engine
    // left at another run's version would never be routed to (and the run would wait forever).
    // A controller killed mid-sync may have loaded the trained version already (the sync phase
    // loads it again): that version is legitimate too.
    const expected = new Set([0, s.trainedVersion]);
    const other = (await this.engines.reportedVersions()).filter((v) => !expected.has(v));
    if (other.length > 0 && s.status === "running") {
      await this.pause(
        `the engines serve weight version ${[...new Set(other)].join(", ")} (another run's weights?), but this run starts from version 0 ` +
          "and has no ref_load to load into them: restart the engines on the base model, or set ref_load to its checkpoint",
      );
    }
  }

  /** Commit decisions (and writes that must land with them), then fold them in. */
  private async commit(list: Decision[], extra?: (tx: Database) => Promise<void>): Promise<void> {
    const s = this.state;
    const status = [...list].reverse().find((d) => d.kind === "run.status");
    const synced = [...list].reverse().find((d) => d.kind === "weights.synced");
    const logged = await appendDecisions(this.deps.db, s.runId, this.lease.epoch, s.seq + 1, list, async (tx) => {
      if (extra) await extra(tx);
      await projectRunInTx(tx, s.runId, {
        ...(status && status.kind === "run.status" ? { status: status.payload.status, lastError: status.payload.reason } : {}),
        ...(synced && synced.kind === "weights.synced" ? { weightVersion: synced.payload.weightVersion } : {}),
      });
    });
    for (const d of logged) apply(this.state, d);
    if (this.state.seq - this.snapshotSeq >= SNAPSHOT_EVERY_DECISIONS) await this.snapshot();
  }

  /** A snapshot is an optimisation of restarts: failing to write one only costs a longer fold. */
  private async snapshot(): Promise<void> {
    const seq = this.state.seq;
    try {
      await saveRunSnapshot(this.deps.db, this.state);
      this.snapshotSeq = seq;
    } catch (e) {
      this.snapshotSeq = seq; // try again after another SNAPSHOT_EVERY_DECISIONS, not on every commit
      this.deps.log.warn({ runId: this.state.runId, seq, err: errorMessage(e) }, "run snapshot not written");
    }
  }

  private async tick(): Promise<boolean> {
    if (isAsync(this.state)) return this.tickAsync();
    // An eval pins the engines' version: nothing moves until its results land.
    if (this.state.pendingEval) return this.awaitEval();
    if (this.state.phase === "collect" && this.state.step === 0 && this.isEvalDue(0) && !this.state.config.skip_eval_before_train) {
      return this.dispatchEval(0, this.state.weightVersion);
    }
    switch (this.state.phase) {
      case "collect":
        return this.collect();
      case "drain":
        return this.drain();
      case "train":
        return this.awaitTrain();
      case "sync":
        return this.sync();
      case "done":
        return false;
    }
  }

  private async collect(): Promise<boolean> {
    if (this.rolloutFunction) return this.rolloutFunction.tick();
    const s = this.state;
    const c = s.config;
    const rbs = c.rollout_batch_size;
    const keys = [...s.inflight].map((groupId) => ({ groupId, round: s.groups.get(groupId)?.round ?? 0 }));
    const { ready, redo } = await this.landedRounds(keys);
    if (redo.length > 0) {
      // A round that ended unfinished without a seal (engine abort or failure): continue it as a new round.
      await this.dispatch(redo);
    }
    if (c.deterministic && ready.length < keys.length) return redo.length > 0;
    ready.sort((a, b) => a - b);
    await this.decideGroups(ready);
    if (s.kept.length >= rbs) {
      const aborted = [...s.inflight].sort((a, b) => a - b).map((groupId) => ({ groupId, round: s.groups.get(groupId)?.round ?? 0 }));
      await this.commit([{ kind: "step.sealed", payload: { step: s.step, kept: [...s.kept].sort((a, b) => a - b), aborted } }]);
      this.deps.crashPoint("controller.after_seal");
      return true;
    }
    if (s.kept.length + s.inflight.size < rbs && (!c.deterministic || s.inflight.size === 0)) {
      await this.drawAndDispatch();
      return true;
    }
    return ready.length > 0 || redo.length > 0;
  }

  /**
   * Filter completed group rounds (in the given order) and record their
   * outcomes, in one transaction: one bulk load, one commit. Sync mode: every
   * group joins the current step. Async mode: each joins the earliest unsealed
   * step, and a step is sealed (and the next one started) as soon as it holds
   * rollout_batch_size groups. The staleness rule is applied at the join:
   * drop cuts stale samples (the group regenerates them in a new round).
   */
  private async decideGroups(ready: readonly number[]): Promise<void> {
    if (ready.length === 0) return;
    const s = this.state;
    const c = s.config;
    const rule = stalenessRule(c);
    const async = isAsync(s);
    const total = totalSteps(s);
    const keys = ready.map((groupId) => {
      const round = s.groups.get(groupId)?.round ?? 0;
      return { groupId, round, maskBeforeRound: c.mask_offpolicy_in_partial_rollout ? round : null };
    });
    const views = await loadGroupsWithRewards(this.deps.db, s.runId, keys, c.n_samples_per_prompt);
    let step = s.step;
    let keptInStep = [...s.kept];
    let remaining = s.kept.length + s.inflight.size + (async ? s.draining.size : 0);
    const list: Decision[] = [];
    const rows: Parameters<typeof insertHistory>[1] = [];
    const regenerate: Array<{ groupId: number; round: number }> = [];
    const decode = (ids: readonly number[]) => this.ctx.tokenizer.decode(ids);
    for (const { groupId, round } of keys) {
      const g = views.get(groupId);
      if (!g) continue;
      const rewards = g.samples.map((x) => g.rewards.get(x.sampleIndex)?.reward ?? 0);
      const verdict = await this.filter({
        groupId,
        rewards,
        samples: g.samples.map((x) => ({ response: decode(x.responseTokens), status: x.status })),
      });
      let outcome: "kept" | "filtered" | "buffered" | "discarded";
      let reason: string | null = null;
      // slime: remaining = groups still able to count (kept + in flight, this one included).
      if (!verdict.keep && shouldDrop(verdict, remaining, c.rollout_batch_size)) {
        outcome = "filtered";
        reason = verdict.reason ?? "filtered";
        remaining--;
      } else if (keptInStep.length < c.rollout_batch_size && step < total) {
        const stale = judgeStaleness(g.samples, step, rule, s.groups.get(groupId)?.regenerations ?? 0);
        if (stale.kind === "cut") {
          // The group stays in flight: its stale samples regenerate from the prompt in the next round.
          list.push(
            { kind: "group.filtered", payload: { groupId, round, step, keep: true, reason: verdict.reason ?? null } },
            { kind: "group.cut", payload: { groupId, step, round: round + 1, samples: stale.samples, reason: stale.reason } },
            this.dispatchDecision(groupId, round + 1),
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
      if (outcome !== "buffered") {
        const minVersion = outcome === "kept" ? maskMinVersion(rule, step) : null;
        const view = { ...g, samples: g.samples.map((x) => maskStale(x, minVersion)) };
        rows.push(...historyRows(s.runId, step, view, g.rewards, outcome, reason, decode, null));
      }
      list.push(
        { kind: "group.filtered", payload: { groupId, round, step, keep: outcome !== "filtered", reason: verdict.reason ?? null } },
        { kind: "group.outcome", payload: { groupId, step, outcome, reason } },
      );
      if (async && keptInStep.length >= c.rollout_batch_size) {
        list.push({ kind: "step.sealed", payload: { step, kept: [...keptInStep].sort((a, b) => a - b), aborted: [] } });
        if (step + 1 < total) list.push({ kind: "step.started", payload: { step: step + 1, weightVersion: s.weightVersion } });
        step++;
        keptInStep = [];
      }
    }
    await this.commit(list, (tx) => insertHistory(tx, rows));
    if (regenerate.length > 0) await this.enqueueRollouts(regenerate);
  }

  private async drawAndDispatch(want = overSamplingBatchSize(this.state.config)): Promise<void> {
    const s = this.state;
    const { fromBuffer, draws, cursor, rows } = await planDraw(
      { dataset: this.dataset, tokenizer: this.ctx.tokenizer, bufferFilter: this.bufferFilter },
      s,
      want,
      s.step,
    );
    const dispatches = [
      ...fromBuffer.map((groupId) => ({ groupId, round: (s.groups.get(groupId)?.round ?? -1) + 1 })),
      ...draws.map((d) => ({ groupId: d.groupId, round: 0 })),
    ];
    const list: Decision[] = [
      { kind: "prompts.drawn", payload: { step: s.step, fromBuffer, fresh: draws, cursor } },
      ...(await this.cutStaleBuffered(fromBuffer)),
      ...dispatches.map((d) => this.dispatchDecision(d.groupId, d.round)),
    ];
    await this.commit(list, async (tx) => {
      await insertDrawnPrompts(tx, rows);
    });
    this.deps.crashPoint("controller.after_draw");
    await this.enqueueRollouts(dispatches);
  }

  /**
   * staleness_policy drop: a buffered group resuming in this step with samples
   * already too stale for it is cut before it resumes (they regenerate from the
   * prompt), rather than continued and cut when it completes. Groups out of
   * regenerations resume as they are and are discarded when they complete.
   */
  private async cutStaleBuffered(fromBuffer: readonly number[]): Promise<Decision[]> {
    const s = this.state;
    const c = s.config;
    const rule = stalenessRule(c);
    if (fromBuffer.length === 0 || rule.policy !== "drop" || rule.maxStaleness === null) return [];
    const keys = fromBuffer.map((groupId) => ({ groupId, round: -1, maskBeforeRound: null }));
    const views = await loadGroupsWithRewards(this.deps.db, s.runId, keys, c.n_samples_per_prompt);
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

  private dispatchDecision(groupId: number, round: number): Decision {
    const s = this.state;
    return { kind: "group.dispatched", payload: { groupId, round, step: s.step, weightVersion: s.weightVersion } };
  }

  private async dispatch(list: Array<{ groupId: number; round: number }>): Promise<void> {
    await this.commit(list.map((d) => this.dispatchDecision(d.groupId, d.round)));
    await this.enqueueRollouts(list);
  }

  /** Enqueue the rollout jobs of committed dispatch decisions (step and version as the decisions recorded them). */
  private async enqueueRollouts(list: Array<{ groupId: number; round: number }>): Promise<void> {
    const s = this.state;
    await this.deps.queues.enqueueMany(
      "rollout",
      list.map((d) => ({ runId: s.runId, groupId: d.groupId, round: d.round, step: s.groups.get(d.groupId)?.step ?? s.step, weightVersion: s.weightVersion })),
    );
  }

  private async drain(): Promise<boolean> {
    const s = this.state;
    const c = s.config;
    const keys = [...s.draining].map(([groupId, round]) => ({ groupId, round }));
    const statuses = await loadRoundStatuses(this.deps.db, s.runId, keys);
    const landed = keys.filter((k) => statuses.has(k.groupId)).sort((a, b) => a.groupId - b.groupId);
    // The landed groups' outcomes, 256 groups per commit (with their history rows when discarded).
    for (let i = 0; i < landed.length; i += 256) {
      const chunk = landed.slice(i, i + 256);
      const outcome = c.partial_rollout ? ("buffered" as const) : ("discarded" as const);
      const decisions = chunk.map((k) => ({ kind: "group.outcome" as const, payload: { groupId: k.groupId, step: s.step, outcome, reason: "aborted" } }));
      if (c.partial_rollout) {
        await this.commit(decisions);
        continue;
      }
      const views = await loadGroupsWithRewards(
        this.deps.db,
        s.runId,
        chunk.map((k) => ({ ...k, maskBeforeRound: null })),
        c.n_samples_per_prompt,
      );
      const rows = [...views.values()].flatMap((g) =>
        historyRows(s.runId, s.step, g, null, "discarded", "aborted", (ids) => this.ctx.tokenizer.decode(ids), null),
      );
      await this.commit(decisions, (tx) => insertHistory(tx, rows));
    }
    if (s.draining.size > 0) return landed.length > 0;
    await this.commit([{ kind: "train.dispatched", payload: { step: s.step, weightVersionIn: s.trainedVersion } }]);
    this.deps.crashPoint("controller.after_train_dispatch");
    await this.deps.queues.enqueue("train", { runId: s.runId, step: s.step }, { attempts: c.max_attempts });
    return true;
  }

  private async awaitTrain(): Promise<boolean> {
    const s = this.state;
    const row = await loadTrainStep(this.deps.db, s.runId, s.step);
    if (!row) return false;
    await this.commit([{ kind: "step.trained", payload: { step: s.step, weightVersionOut: row.weightVersionOut, checkpointUri: row.checkpointUri } }]);
    this.deps.log.info({ runId: s.runId, step: s.step, version: row.weightVersionOut }, "train step committed");
    return true;
  }

  private isEvalDue(boundary: number): boolean {
    const c = this.state.config;
    if (c.eval_interval === null || c.eval_prompt_data === null || this.state.evalsDispatched.has(boundary)) return false;
    return boundary === 0 || boundary % c.eval_interval === 0 || boundary === totalSteps(this.state);
  }

  private async dispatchEval(boundary: number, weightVersion: number): Promise<boolean> {
    const runId = this.state.runId;
    await this.commit([{ kind: "eval.dispatched", payload: { step: boundary, weightVersion } }]);
    await this.deps.queues.enqueue("eval", { runId, step: boundary });
    return true;
  }

  private async awaitEval(): Promise<boolean> {
    const pending = this.state.pendingEval;
    if (!pending) return false;
    const rows = await loadEvalResults(this.deps.db, this.state.runId, pending.step);
    if (rows.length === 0) return false;
    await this.commit([{ kind: "eval.recorded", payload: { step: pending.step } }]);
    for (const r of rows)
      this.deps.log.info({ runId: this.state.runId, step: r.step, dataset: r.dataset, meanReward: r.meanReward, passAtK: r.passAtK }, "eval recorded");
    return true;
  }

  private async sync(): Promise<boolean> {
    const s = this.state;
    const c = s.config;
    const total = totalSteps(s);
    const isLast = s.step + 1 >= total;
    // Evals run after the step's sync, on the synced version (weights.synced is then already recorded).
    if (s.weightVersion === s.trainedVersion && this.isEvalDue(s.step + 1)) return this.dispatchEval(s.step + 1, s.weightVersion);
    if (((s.step + 1) % c.update_weights_interval === 0 || isLast) && s.weightVersion !== s.trainedVersion) {
      const uri = s.trainedCheckpointUri as string;
      await this.engines.loadWeights(s.trainedVersion, uri);
      await this.commit([{ kind: "weights.synced", payload: { step: s.step, weightVersion: s.trainedVersion, checkpointUri: uri } }]);
      this.deps.crashPoint("controller.after_sync");
      if (this.isEvalDue(s.step + 1)) return this.dispatchEval(s.step + 1, s.weightVersion);
    }
    if (isLast) {
      await this.commit([{ kind: "run.status", payload: { status: "completed", reason: null } }]);
      this.deps.log.info({ runId: s.runId, steps: total }, "run completed");
    } else {
      await this.commit([{ kind: "step.started", payload: { step: s.step + 1, weightVersion: s.weightVersion } }]);
    }
    return true;
  }

  // ---- Asynchronous mode (train_async): generation, training and weight sync overlap (DESIGN §1). ----

  private async tickAsync(): Promise<boolean> {
    const s = this.state;
    if (s.step === 0 && s.lastTrainedStep < 0 && this.isEvalDue(0) && !s.config.skip_eval_before_train) return this.dispatchEval(0, s.weightVersion);
    let progressed = false;
    if (s.pendingEval) progressed = (await this.awaitEval()) || progressed;
    progressed = (await this.collectAsync()) || progressed;
    progressed = (await this.trainAsync()) || progressed;
    progressed = (await this.syncAsync()) || progressed;
    if (s.status === "running" && s.syncing === null) progressed = (await this.admitAsync()) || progressed;
    return progressed;
  }

  /**
   * Of these rounds, the landed ones: complete with every reward in (ready to
   * decide), or unfinished (aborted or an engine failure: `redo` holds the
   * round that continues them). Rounds still generating are in neither.
   */
  private async landedRounds(
    keys: ReadonlyArray<{ groupId: number; round: number }>,
  ): Promise<{ ready: number[]; redo: Array<{ groupId: number; round: number }> }> {
    const n = this.state.config.n_samples_per_prompt;
    const statuses = await loadRoundStatuses(this.deps.db, this.state.runId, keys);
    const ready: number[] = [];
    const redo: Array<{ groupId: number; round: number }> = [];
    for (const k of keys) {
      const st = statuses.get(k.groupId);
      if (!st) continue;
      if (!st.isComplete) redo.push({ groupId: k.groupId, round: k.round + 1 });
      else if (st.rewardCount >= n) ready.push(k.groupId);
    }
    return { ready, redo };
  }

  /** Every group generating or aborted-and-not-landed, with its current round. */
  private liveRounds(): Array<{ groupId: number; round: number }> {
    const s = this.state;
    return [
      ...[...s.inflight].map((groupId) => ({ groupId, round: s.groups.get(groupId)?.round ?? 0 })),
      ...[...s.draining].map(([groupId, round]) => ({ groupId, round })),
    ];
  }

  /**
   * Completed groups join the earliest unsealed step (decideGroups seals
   * full steps); a round that ended unfinished (aborted for a weight sync,
   * or an engine failure) continues as a new round at the current version.
   * While a sync is in progress nothing is decided or dispatched: it only
   * waits for the old version's rounds to land.
   */
  private async collectAsync(): Promise<boolean> {
    const s = this.state;
    if (s.syncing !== null) return false;
    const keys = this.liveRounds();
    if (keys.length === 0) return false;
    const { ready, redo } = await this.landedRounds(keys);
    if (redo.length > 0) await this.dispatch(redo);
    ready.sort((a, b) => a - b);
    await this.decideGroups(ready);
    return ready.length > 0 || redo.length > 0;
  }

  /** Steps train one at a time, in order, while generation goes on. */
  private async trainAsync(): Promise<boolean> {
    const s = this.state;
    if (s.training !== null) {
      const row = await loadTrainStep(this.deps.db, s.runId, s.training);
      if (!row) return false;
      await this.commit([{ kind: "step.trained", payload: { step: s.training, weightVersionOut: row.weightVersionOut, checkpointUri: row.checkpointUri } }]);
      this.deps.log.info({ runId: s.runId, step: row.step, version: row.weightVersionOut }, "train step committed");
      return true;
    }
    const next = s.trainQueue[0];
    if (next === undefined) return false;
    await this.commit([{ kind: "train.dispatched", payload: { step: next, weightVersionIn: s.trainedVersion } }]);
    this.deps.crashPoint("controller.after_train_dispatch");
    await this.deps.queues.enqueue("train", { runId: s.runId, step: next }, { attempts: s.config.max_attempts });
    return true;
  }

  /**
   * Weight sync: record the intent (weights.syncing) with the in-flight rounds
   * to abort (weight_update_mode abort) or none (drain), wait until every round
   * of the old version landed, then load the engines and record weights.synced.
   * No request spans two versions: one segment, one version.
   */
  private async syncAsync(): Promise<boolean> {
    const s = this.state;
    const c = s.config;
    const total = totalSteps(s);
    if (s.syncing !== null) {
      const keys = this.liveRounds();
      const statuses = await loadRoundStatuses(this.deps.db, s.runId, keys);
      if (keys.some((k) => !statuses.has(k.groupId))) return false;
      const target = s.syncing;
      const row = await loadTrainStep(this.deps.db, s.runId, target.step);
      if (!row) throw new RlqError("batch_inconsistent", `run ${s.runId}: syncing to step ${target.step}'s weights, which never committed`);
      await this.engines.loadWeights(target.weightVersion, row.checkpointUri);
      await this.commit([{ kind: "weights.synced", payload: { step: target.step, weightVersion: target.weightVersion, checkpointUri: row.checkpointUri } }]);
      this.deps.crashPoint("controller.after_sync");
      if (this.isEvalDue(target.step + 1)) await this.dispatchEval(target.step + 1, target.weightVersion);
      return true;
    }
    const last = s.lastTrainedStep;
    if (s.trainedVersion === s.weightVersion) {
      if (last + 1 >= total && s.training === null && s.trainQueue.length === 0 && !s.pendingEval && s.inflight.size === 0 && s.draining.size === 0) {
        await this.commit([{ kind: "run.status", payload: { status: "completed", reason: null } }]);
        this.deps.log.info({ runId: s.runId, steps: total }, "run completed");
        return true;
      }
      return false;
    }
    // An eval pins the engines' version until its results land.
    if (s.pendingEval) return false;
    if ((last + 1) % c.update_weights_interval !== 0 && last + 1 < total) return false;
    const list: Decision[] = [{ kind: "weights.syncing", payload: { step: last, weightVersion: s.trainedVersion, mode: c.weight_update_mode } }];
    if (c.weight_update_mode === "abort") {
      const keys = [...s.inflight].map((groupId) => ({ groupId, round: s.groups.get(groupId)?.round ?? 0 }));
      const statuses = await loadRoundStatuses(this.deps.db, s.runId, keys);
      for (const k of keys.sort((a, b) => a.groupId - b.groupId)) {
        if (statuses.has(k.groupId)) continue; // already landed: nothing to abort
        list.push({
          kind: "group.aborted",
          payload: { groupId: k.groupId, round: k.round, step: s.step, reason: `weight sync to version ${s.trainedVersion}` },
        });
      }
    }
    await this.commit(list);
    return true;
  }

  /**
   * Admission control, counted in groups (AReaL's rule): a new group starts
   * only while accepted + running < (k + v + 1) × rollout_batch_size, v the
   * engines' version; filtered-out groups free their place. No more than the
   * run's remaining steps can use.
   */
  private async admitAsync(): Promise<boolean> {
    const s = this.state;
    const c = s.config;
    const k = effectiveMaxStaleness(c) ?? 1;
    const rbs = c.rollout_batch_size;
    const cap = Math.min((k + s.weightVersion + 1) * rbs, totalSteps(s) * rbs);
    const free = cap - s.acceptedGroups - s.inflight.size - s.draining.size;
    if (free <= 0) return false;
    await this.drawAndDispatch(Math.min(free, overSamplingBatchSize(c)));
    return true;
  }

  /** Operator requests (pause, resume, cancel, amend) become decisions here. */
  private async handleRequests(): Promise<void> {
    const s = this.state;
    for (const r of await pendingRunRequests(this.deps.db, s.runId)) {
      let error: string | null = null;
      try {
        if (r.kind === "pause" && s.status === "running") {
          await this.commit([{ kind: "run.status", payload: { status: "paused", reason: "paused by operator" } }]);
        } else if (r.kind === "resume" && s.status === "paused") {
          await this.commit([{ kind: "run.status", payload: { status: "running", reason: null } }]);
          await this.reconcile(true);
        } else if (r.kind === "cancel" && (s.status === "running" || s.status === "paused")) {
          await this.commit([{ kind: "run.status", payload: { status: "cancelled", reason: "cancelled by operator" } }]);
        } else if (r.kind === "amend") {
          const changes = (r.payload as { changes?: Record<string, unknown> }).changes ?? {};
          const bad = Object.keys(changes).filter((k) => !(k in amendableKeys));
          if (bad.length > 0) throw new Error(`keys ${bad.join(", ")} cannot be amended on a live run (allowed: ${Object.keys(amendableKeys).join(", ")})`);
          const next = parseRunConfig({ ...s.config, ...changes }, "amended config");
          if (isAsync(s) && next.num_rollout !== null) {
            // Async mode may have sealed steps ahead of the trainer: they are decided, so they are trained.
            const sealed = s.lastTrainedStep + 1 + (s.training !== null ? 1 : 0) + s.trainQueue.length;
            if (next.num_rollout < sealed)
              throw new Error(`num_rollout ${next.num_rollout} is below the ${sealed} step(s) already sealed; the smallest allowed is ${sealed}`);
          }
          const amended = { ...s.config, ...changes } as Record<string, unknown>;
          await this.commit([{ kind: "run.amended", payload: { changes } }], (tx) => projectRunInTx(tx, s.runId, { config: amended }));
        }
      } catch (e) {
        if (e instanceof LeaseLostError) throw e;
        error = errorMessage(e);
      }
      await markRunRequest(this.deps.db, r.id, this.state.seq, error);
    }
  }

  private async pause(reason: string): Promise<void> {
    if (this.state.status !== "running") return;
    this.deps.log.error({ runId: this.state.runId, reason }, "run paused");
    await this.commit([{ kind: "run.status", payload: { status: "paused", reason } }]);
  }

  /** Make the queues match the state: missing jobs added, failed ones retried (or the run paused). */
  async reconcile(isResume: boolean): Promise<void> {
    this.lastReconcile = Date.now();
    const s = this.state;
    if (s.status !== "running") return;
    const n = s.config.n_samples_per_prompt;
    const async = isAsync(s);
    if (s.phase === "collect" || s.phase === "drain") {
      const keys = async
        ? this.liveRounds()
        : s.phase === "collect"
          ? [...s.inflight].map((groupId) => ({ groupId, round: s.groups.get(groupId)?.round ?? 0 }))
          : [...s.draining].map(([groupId, round]) => ({ groupId, round }));
      const statuses = await loadRoundStatuses(this.deps.db, s.runId, keys);
      for (const k of keys) {
        const st = statuses.get(k.groupId);
        const data = { runId: s.runId, groupId: k.groupId, round: k.round, step: s.groups.get(k.groupId)?.step ?? s.step };
        const roundStatus = async () => (await loadRoundStatuses(this.deps.db, s.runId, [k])).get(k.groupId);
        if (!st) await this.ensureJob("rollout", { ...data, weightVersion: s.weightVersion }, isResume, async () => (await roundStatus()) !== undefined);
        else if (s.phase === "collect" && st.isComplete && st.rewardCount < n) {
          await this.ensureJob("reward", data, isResume, async () => ((await roundStatus())?.rewardCount ?? 0) >= n);
        }
      }
    }
    const pendingEval = s.pendingEval;
    const hasEval = async () => pendingEval !== null && (await loadEvalResults(this.deps.db, s.runId, pendingEval.step)).length > 0;
    if (pendingEval && !(await hasEval())) {
      await this.ensureJob("eval", { runId: s.runId, step: pendingEval.step }, isResume, hasEval);
    }
    const training = async ? s.training : s.phase === "train" ? s.step : null;
    const hasTrained = async () => training !== null && (await loadTrainStep(this.deps.db, s.runId, training)) !== null;
    if (training !== null && !(await hasTrained())) {
      await this.ensureJob("train", { runId: s.runId, step: training }, isResume, hasTrained, s.config.max_attempts);
    }
  }

  /**
   * Make one expected job exist (`reconcileAction` decides from the job's
   * state). `hasFact` is read again before a job is added or re-run: a job
   * that finished between the caller's fact check and this look at the queue
   * is done, not lost.
   */
  private async ensureJob<K extends QueueKind>(
    kind: K,
    data: JobData<K>,
    isResume: boolean,
    hasFact: () => Promise<boolean>,
    attempts?: number,
  ): Promise<void> {
    const q = this.deps.queues;
    const id = (jobIds[kind] as (d: JobData<K>) => string)(data);
    const info = await q.info(kind, id);
    const action = reconcileAction(kind, info, isResume);
    if (action === "add" || action === "replace") {
      if (await hasFact()) return;
      if (action === "replace") {
        this.deps.log.warn(
          { runId: data.runId, kind, jobId: id, state: info.state },
          `${kind} job ${info.state === "unknown" ? "in no queue list" : "completed"} without its fact: adding it again`,
        );
        await q.remove(kind, id);
      }
      await q.enqueue(kind, data, attempts === undefined ? {} : { attempts });
    } else if (action === "pause") {
      await this.pause(`${kind} job ${id} failed after ${info.attemptsMade} attempt(s): ${info.failedReason ?? "unknown error"}`);
    } else if (action === "retry") {
      await q.retry(kind, id);
    }
  }
}

/**
 * What reconcile does with an expected job whose fact is missing, from the
 * job's queue state:
 * - missing: add it;
 * - completed without its fact (cannot normally happen), or a job record in
 *   no list at all (state "unknown": a partial loss of the queue state, e.g.
 *   keys lost in a failover or a non-atomic flush, leaves the record but not
 *   its list entry; BullMQ would ignore a plain add of its id): remove and
 *   add again;
 * - failed: retry; an unrecoverable failure or a train job that used up its
 *   attempts pauses the run instead, except while resuming (a resume retries);
 * - waiting, active, delayed: nothing (BullMQ's stall check covers a dead worker).
 */
export function reconcileAction(kind: QueueKind, info: JobInfo, isResume: boolean): "none" | "add" | "replace" | "retry" | "pause" {
  switch (info.state) {
    case "missing":
      return "add";
    case "completed":
    case "unknown":
      return "replace";
    case "failed": {
      const isFatal = (info.failedReason ?? "").startsWith(UNRECOVERABLE_PREFIX) || kind === "train";
      return isFatal && !isResume ? "pause" : "retry";
    }
    default:
      return "none";
  }
}

export async function setRunError(db: Db, runId: string, message: string): Promise<void> {
  await setRunProjection(db, runId, { lastError: message });
}
