import { pathToFileURL } from "node:url";
import { isReplayRun } from "../config/debug-keys.ts";
import type { Database } from "../store/db.ts";
import { appendDecisions, LeaseLostError, tryAcquireLease, type Lease } from "../store/decision-log.ts";
import { loadRunState, saveRunSnapshot, SNAPSHOT_EVERY_DECISIONS } from "../store/run-snapshots.ts";
import { projectRunInTx } from "../store/projections.ts";
import { applyDecisions, isAsync, type RunState } from "../core/run-state.ts";
import { shouldLoadOnStart } from "../core/colocate.ts";
import type { Decision } from "../core/decisions.ts";
import type { Dataset } from "../data/dataset.ts";
import { loadRunDataset } from "../runtime/plugins-registry.ts";
import { loadTrainStep } from "../store/train-facts.ts";
import { createBufferFilter, createDynamicFilter, type BufferFilter, type DynamicFilter } from "../runtime/filters.ts";
import type { RunContext } from "../runtime/run-context.ts";
import { createEngineAdmin, type EngineAdmin } from "./engine-admin.ts";
import { checkFingerprints } from "./fingerprints.ts";
import { createRolloutFunctionDriver, type RolloutFunctionDriver } from "./rollout-function.ts";
import type { ControllerDeps, ControllerHost } from "./host.ts";
import { enqueueJobsFor } from "./jobs.ts";
import { tickSync } from "./sync-step.ts";
import { tickAsync } from "./async-pipeline.ts";
import { reconcile } from "./reconcile.ts";
import { handleRequests } from "./requests.ts";
import { sleep } from "../lib/sleep.ts";
import { coalescedNotifier, createWaker, type Waker } from "../store/notify.ts";
import { errorMessage } from "../lib/errors.ts";

export type { ControllerDeps } from "./host.ts";
export { reconcileAction } from "./reconcile.ts";

/**
 * The per-run controller (docs/architecture.md "The loop"). It holds the run's lease, folds the
 * decision log into state, and ticks the sync step (sync-step.ts) or the async
 * pipeline (async-pipeline.ts). Decisions are made in core/ (decide-groups.ts,
 * pipeline.ts, the fold); every decision is committed before its job is
 * enqueued (outbox, jobs.ts); on start, periodically, and whenever the queue's
 * sentinel vanished it reconciles the queues with what the state expects
 * (reconcile.ts).
 */
const STANDBY_WAIT_MS = 1000;
const SENTINEL_CHECK_MS = 1000;

export type ControllerExit = "completed" | "cancelled" | "stopped" | "lease_lost";

export async function runController(deps: ControllerDeps, runId: string, signal: AbortSignal): Promise<ControllerExit> {
  let lease: Lease | null = null;
  const waitFrom = Date.now();
  while (!signal.aborted) {
    // Standby while another controller holds the run: each attempt waits in Postgres's lock queue
    // for up to a second (woken when the holder's lock goes), then looks at the signal again.
    const t0 = Date.now();
    lease = await tryAcquireLease(deps.db, runId, deps.holder, STANDBY_WAIT_MS);
    if (lease) break;
    await sleep(Math.max(0, STANDBY_WAIT_MS - (Date.now() - t0)), signal);
  }
  if (!lease) return "stopped";
  const leaseLost = { value: false };
  void lease.lost.then(() => {
    leaseLost.value = true;
  });
  try {
    const c = await RunController.start(deps, lease, Date.now() - waitFrom);
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

class RunController implements ControllerHost {
  private lastReconcile = 0;
  private lastSentinelCheck = 0;

  /**
   * The sentinel is looked at once a second, not every tick: a tick follows every fact a
   * job lands (hundreds a second at 64 engines), and the look is a BullMQ job fetch.
   */
  private isSentinelDue(): boolean {
    if (Date.now() - this.lastSentinelCheck < SENTINEL_CHECK_MS) return false;
    this.lastSentinelCheck = Date.now();
    return true;
  }
  /** rollout_function_path: the user's planner runs the collect phase (rollout-function.ts). */
  private rolloutFunction: RolloutFunctionDriver | null = null;
  /** seq of the run's latest snapshot (store/run-snapshots.ts; -1: none). */
  private snapshotSeq = -1;
  /** The state as of the last commit; each commit replaces it with a new value (`applyDecisions`). */
  private current: RunState;

  get state(): RunState {
    return this.current;
  }

  private constructor(
    readonly deps: ControllerDeps,
    private readonly lease: Lease,
    state: RunState,
    readonly ctx: RunContext,
    readonly dataset: Dataset,
    readonly filter: DynamicFilter,
    readonly bufferFilter: BufferFilter,
    readonly engines: EngineAdmin,
  ) {
    this.current = state;
  }

  static async start(deps: ControllerDeps, lease: Lease, leaseWaitMs = 0): Promise<RunController> {
    const t0 = Date.now();
    // The latest snapshot and the decisions after it: the same state as folding the whole log.
    const { state, fromSnapshotSeq } = await loadRunState(deps.db, lease.runId);
    const stateMs = Date.now() - t0;
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
      (deps.engineAdmin ?? (() => createEngineAdmin(c, { onEngineLoaded: coalescedNotifier(deps.db.pool, "rlq_weights", lease.runId) })))(ctx),
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
    const t1 = Date.now();
    await ctl.resyncEngines();
    const t2 = Date.now();
    await ctl.reconcile(false);
    const t3 = Date.now();
    // Where a restart's time went: the lease (before t0), the state (snapshot + fold), the engines' weights, the queues.
    const phasesMs = { lease: leaseWaitMs, state: stateMs, setup: t1 - t0 - stateMs, engines: t2 - t1, reconcile: t3 - t2 };
    deps.log.info(
      { runId: lease.runId, epoch: lease.epoch, seq: ctl.state.seq, step: ctl.state.step, phase: ctl.state.phase, ms: t3 - t0, phasesMs },
      "controller took the run",
    );
    return ctl;
  }

  async close(): Promise<void> {
    await this.engines
      .close()
      .catch((e: unknown) => this.deps.log.warn({ runId: this.state.runId, err: errorMessage(e) }, "controller: engine admin did not close cleanly"));
  }

  async loop(signal: AbortSignal, leaseLost: { value: boolean }): Promise<ControllerExit> {
    const pollMs = this.deps.pollMs ?? 100;
    // Between ticks the controller waits for the poll interval or for a wake-up: a round, rewards, a
    // train step or eval results of this run committed (store/notify.ts). Cleared before each tick,
    // so a fact that lands during a tick makes the next one start at once.
    const waker = createWaker();
    const unsubscribe = this.deps.db.notifications.subscribe("rlq_facts", this.state.runId, waker.wake);
    try {
      return await this.ticks(signal, leaseLost, pollMs, waker);
    } finally {
      unsubscribe();
    }
  }

  private async ticks(signal: AbortSignal, leaseLost: { value: boolean }, pollMs: number, waker: Waker): Promise<ControllerExit> {
    while (!signal.aborted) {
      if (leaseLost.value) return "lease_lost";
      waker.clear();
      await this.handleRequests();
      const s = this.state.status;
      if (s === "completed") return "completed";
      if (s === "cancelled") return "cancelled";
      let progressed = false;
      if (s === "running") {
        if (this.isSentinelDue() && !(await this.deps.queues.ensureSentinel(this.state.runId))) {
          this.deps.log.warn({ runId: this.state.runId }, "queue state was lost (sentinel missing): reconciling");
          await this.reconcile(false);
        } else if (Date.now() - this.lastReconcile > (this.deps.reconcileMs ?? 5000)) {
          await this.reconcile(false);
        }
        progressed = await this.tick();
      }
      if (!progressed) await waker.wait(pollMs, signal);
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
    // A train-only run (debug_rollouts_from) generates nothing: its engines, if any are configured, are never used.
    if (isReplayRun(s.config)) return;
    // Colocated engines released (or about to be) take no load now: the step loads the trained
    // version itself once their weights resume (core/colocate.ts). Nor any health check while the
    // log says their memory is released: this process's pool learns it here, before its first use.
    if (s.config.colocate && s.engineMemory !== "resident") await this.engines.adoptLoggedMemory(s.engineMemory);
    if (s.config.colocate && !shouldLoadOnStart(s)) return;
    // A sync that dispatched at its version before it ended (async-pipeline.ts continueDuringSync):
    // requests may be running on it already, so the engines get that version, not the last synced one.
    if (s.syncing !== null && this.engines.isEarlyDispatch && s.config.weight_update_mode === "abort") {
      const row = await loadTrainStep(this.deps.db, s.runId, s.syncing.step);
      if (row) {
        await this.engines.resumeLoad(s.syncing.weightVersion, row.checkpointUri);
        return;
      }
    }
    const uri = s.weightVersion === 0 ? (s.config.ref_load ? pathToFileURL(s.config.ref_load).href : null) : s.checkpointUri;
    if (uri) {
      await this.engines.restoreVersion(s.weightVersion, uri);
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
  async commit(list: Decision[], extra?: (tx: Database) => Promise<void>): Promise<void> {
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
    this.current = applyDecisions(this.current, logged);
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

  /** `commit`, then the crash point, then the jobs the decisions call for (outbox: decision first, then job). */
  async commitThenEnqueue(list: Decision[], options: { extra?: (tx: Database) => Promise<void>; crashPoint?: string } = {}): Promise<void> {
    await this.commit(list, options.extra);
    if (options.crashPoint) this.deps.crashPoint(options.crashPoint);
    await enqueueJobsFor(this.deps.queues, this.state.runId, this.state.config, list);
  }

  private async tick(): Promise<boolean> {
    return isAsync(this.state) ? tickAsync(this) : tickSync(this, this.rolloutFunction);
  }

  private async handleRequests(): Promise<void> {
    await handleRequests(this, () => this.reconcile(true));
  }

  async pause(reason: string): Promise<void> {
    if (this.state.status !== "running") return;
    this.deps.log.error({ runId: this.state.runId, reason }, "run paused");
    await this.commit([{ kind: "run.status", payload: { status: "paused", reason } }]);
  }

  /** Make the queues match the state: missing jobs added, failed ones retried (or the run paused). */
  async reconcile(isResume: boolean): Promise<void> {
    this.lastReconcile = Date.now();
    await reconcile(this, isResume);
  }
}
