/** What the colocated-mode tests share (colocate.test.ts on the fake trainer, colocate-torch.test.ts on the real one). */
import { expect } from "vitest";
import type { Db } from "../../src/store/db.ts";

/**
 * Controller crash points, one in each phase, with the phase it kills in. Two of them fall between
 * an endpoint call and its decision, where the restarted controller sends the call again. (Each
 * restart of `rlq up` costs seconds of process start: one kill a phase keeps the tests short.)
 */
export const colocateCrashPoints = [
  ["controller.before_release_decision", "released (the release sent, not recorded)"],
  ["controller.after_train_dispatch", "training"],
  ["controller.before_resume_decision", "pushing (the weights resumed, not recorded)"],
  ["controller.after_sync", "resuming (the trained version loaded, the KV cache not resumed)"],
] as const;

/** Per step, the phases in the log's order: released → trained → weights resumed → synced → KV cache resumed → next step. */
export async function expectColocatedPhases(db: Db, runId: string, numRollout: number): Promise<void> {
  const log = (
    await db.pool.query<{ kind: string; step: number | null; tag: string | null }>(
      "SELECT kind, step, payload->>'tag' AS tag FROM decisions WHERE run_id = $1 AND kind IN ('step.sealed', 'engines.released', 'train.dispatched', 'step.trained', 'engines.resumed', 'weights.synced', 'step.started') ORDER BY seq",
      [runId],
    )
  ).rows.map((d) => `${d.kind}${d.tag ? `:${d.tag}` : ""}@${d.step}`);
  expect(log).toEqual(
    [...Array(numRollout).keys()].flatMap((step) => [
      ...(step > 0 ? [`step.started@${step}`] : []),
      `step.sealed@${step}`,
      `engines.released@${step}`,
      `train.dispatched@${step}`,
      `step.trained@${step}`,
      `engines.resumed:weights@${step}`,
      `weights.synced@${step}`,
      `engines.resumed:kv_cache@${step}`,
    ]),
  );
}
