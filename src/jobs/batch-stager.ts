import type { Db } from "../store/db.ts";
import { findGroupOutcomes } from "../store/run-facts.ts";
import { loadGroupsWithRewards } from "../store/group-view.ts";
import { outcomeLoads, type GroupLoad } from "../core/group-load.ts";
import type { RunContext } from "../runtime/run-context.ts";
import { errorMessage, RlqError } from "../lib/errors.ts";
import type { Logger } from "../observability/logger.ts";
import { groupSamples, isSameLoad, type StagedGroup } from "./train-batch.ts";

/** Steps a run keeps staged: the collecting ones (async: up to max_staleness + 1) and the one training. */
const MAX_STAGED_STEPS = 4;
/** Groups per load statement (the train job's own chunk). */
const CHUNK = 256;

interface RunStaging {
  ctx: RunContext;
  /** Highest decision seq read; null until the first pass (which reads by step). */
  lastSeq: number | null;
  fromStep: number;
  byStep: Map<number, Map<number, StagedGroup>>;
  pass: Promise<void> | null;
  isDirty: boolean;
  unsubscribe: () => void;
}

/** `log`: where a failed pass is told (it costs the train job time, never a different batch). */
export function createBatchStager(db: Db, log?: Pick<Logger, "warn">): BatchStager {
  return new BatchStager(db, log);
}

/**
 * The train batch, built while its step collects. Each kept group is final
 * when the controller records it (its rounds are written and scored, and a
 * kept group is never dispatched again), so the train worker reads it and
 * builds its samples then, woken by `rlq_kept` (store/notify.ts), instead of
 * doing it for the whole batch after the seal, where it lengthens the seal →
 * train-start bubble in proportion to the batch's tokens (bench/cluster-sim.ts).
 *
 * Only a speed-up: the train job uses a staged group when its load (round and
 * masks) is exactly the one `stepLoads` derives for it, and reads every other
 * group itself, so a lost notification or a pass still running at the seal
 * costs time, never a different batch. A run is followed from its first train
 * job in this process on; its first step here is read whole.
 *
 * Per run followed, its staged groups by step. A run's pass is idle
 * (`pass` null), running, or running and asked again (`isDirty`: one more pass follows); `wake` is
 * the only writer of those, `passOnce` of what is staged, `take` of the step followed from.
 */
export class BatchStager {
  private readonly runs = new Map<string, RunStaging>();

  constructor(
    private readonly db: Db,
    private readonly log?: Pick<Logger, "warn">,
  ) {}

  /**
   * Take what is staged for `ctx`'s step `step` (its train job is starting) and go on staging the
   * steps after it. The map may hold groups of the step that the batch does not train (staged
   * before a redo); `loadTrainBatch` uses only those whose load matches.
   */
  take(ctx: RunContext, step: number): ReadonlyMap<number, StagedGroup> {
    let r = this.runs.get(ctx.runId);
    if (!r) {
      const fresh: RunStaging = {
        ctx,
        lastSeq: null,
        fromStep: step + 1,
        byStep: new Map(),
        pass: null,
        isDirty: false,
        unsubscribe: () => undefined,
      };
      fresh.unsubscribe = this.db.notifications.subscribe("rlq_kept", ctx.runId, () => this.wake(fresh));
      this.runs.set(ctx.runId, (r = fresh));
    }
    r.ctx = ctx;
    const staged = r.byStep.get(step) ?? new Map<number, StagedGroup>();
    r.fromStep = Math.max(r.fromStep, step + 1);
    for (const s of r.byStep.keys()) if (s <= step) r.byStep.delete(s);
    this.wake(r);
    return staged;
  }

  /** Resolves when no pass runs for `runId` (tests: every kept group committed so far is staged). */
  async settled(runId: string): Promise<void> {
    while (this.runs.get(runId)?.pass) await this.runs.get(runId)?.pass;
  }

  /** Stop following every run. A pass still reading is not waited for (the database may be away): it ends in an error or in a map no one reads. */
  close(): void {
    for (const r of this.runs.values()) r.unsubscribe();
    this.runs.clear();
  }

  private wake(r: RunStaging): void {
    if (r.pass) {
      r.isDirty = true;
      return;
    }
    r.pass = (async () => {
      do {
        r.isDirty = false;
        // A failed pass (the database away) only means the train job reads more itself.
        await this.passOnce(r).catch((e: unknown) =>
          this.log?.warn({ runId: r.ctx.runId, err: errorMessage(e) }, "batch stager: pass failed (the train job reads those groups itself)"),
        );
      } while (r.isDirty);
    })().finally(() => {
      r.pass = null;
    });
  }

  /** Read the run's kept groups decided since the last pass and stage each one's samples. */
  private async passOnce(r: RunStaging): Promise<void> {
    const { runId } = r.ctx;
    const found = await findGroupOutcomes(this.db, runId, r.lastSeq === null ? { fromStep: r.fromStep } : { afterSeq: r.lastSeq });
    r.lastSeq = found.at(-1)?.seq ?? r.lastSeq; // in seq order
    // The controller commits a group's verdict with its outcome, so each pass sees both: the shared
    // fold (what replay and history use) gives each kept group its round and masks.
    const loads = outcomeLoads(r.ctx.config, found).filter(
      (o) => o.outcome === "kept" && o.step >= r.fromStep && !isSameLoad(r.byStep.get(o.step)?.get(o.groupId)?.load, o.load),
    );
    for (let i = 0; i < loads.length; i += CHUNK) await this.stageChunk(r, loads.slice(i, i + CHUNK));
    // A process that stopped training this run (another train worker took it over) holds a few steps at most.
    for (const step of [...r.byStep.keys()].sort((a, b) => b - a).slice(MAX_STAGED_STEPS)) r.byStep.delete(step);
  }

  private async stageChunk(r: RunStaging, chunk: ReadonlyArray<{ step: number; load: GroupLoad }>): Promise<void> {
    const views = await loadGroupsWithRewards(
      this.db,
      r.ctx.runId,
      chunk.map((c) => c.load),
      r.ctx.config.n_samples_per_prompt,
    );
    for (const { step, load } of chunk) {
      const view = views.get(load.groupId);
      if (!view || step < r.fromStep) continue;
      let built;
      try {
        built = groupSamples(view, load, step);
      } catch (e) {
        // Inconsistent (a reward missing): the train job reads the group itself and fails with the reason.
        if (e instanceof RlqError && e.code === "batch_inconsistent") continue;
        throw e;
      }
      let staged = r.byStep.get(step);
      if (!staged) r.byStep.set(step, (staged = new Map()));
      staged.set(load.groupId, { load, ...built });
    }
  }
}
