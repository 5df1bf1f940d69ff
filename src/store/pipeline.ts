import type { Db } from "./db.ts";

/**
 * The run's pipeline as the facts show it (`rlq run status`, bench/): groups
 * in flight by the version they generate under, the staleness of trained
 * samples, and how busy the trainer was. Read-only queries over facts.
 */
export interface PipelineReport {
  /** Groups whose latest round is dispatched and has not landed, by weight version. */
  inflightByVersion: Record<string, number>;
  /** Trained samples by staleness (versions), from the `staleness` view. */
  stalenessHistogram: Record<string, number>;
  /** Groups regenerated (group.cut) and discarded as stale under staleness_policy drop. */
  regenerations: number;
  staleDiscards: number;
  /** Sealed steps not yet committed by the trainer. */
  sealedNotTrained: number;
  trainer: TrainerUtilization;
}

export interface TrainerUtilization {
  stepsTrained: number;
  /** Σ over steps of (train_steps.committed_at − its train.dispatched decision). */
  busySeconds: number;
  /** From the first prompt draw to the last train commit. */
  wallSeconds: number;
  /** busy / wall (0 when nothing trained). */
  busyFraction: number;
}

export async function trainerUtilization(db: Db, runId: string): Promise<TrainerUtilization> {
  const { rows } = await db.pool.query<{ steps: number; busy: number | null; wall: number | null }>(
    `SELECT count(*)::int AS steps,
            sum(extract(epoch FROM t.committed_at - d.created_at))::float8 AS busy,
            extract(epoch FROM max(t.committed_at) - (SELECT min(created_at) FROM decisions WHERE run_id = $1 AND kind = 'prompts.drawn'))::float8 AS wall
       FROM train_steps t
       JOIN decisions d ON d.run_id = t.run_id AND d.kind = 'train.dispatched' AND d.step = t.step
      WHERE t.run_id = $1`,
    [runId],
  );
  const r = rows[0];
  const busy = r?.busy ?? 0;
  const wall = r?.wall ?? 0;
  return { stepsTrained: r?.steps ?? 0, busySeconds: busy, wallSeconds: wall, busyFraction: wall > 0 ? busy / wall : 0 };
}

export async function pipelineReport(db: Db, runId: string): Promise<PipelineReport> {
  const q = async <T extends Record<string, unknown>>(text: string) => (await db.pool.query<T>(text, [runId])).rows;
  const inflight = await q<{ v: number; n: number }>(
    `SELECT (d.payload->>'weightVersion')::int AS v, count(*)::int AS n
       FROM decisions d
      WHERE d.run_id = $1 AND d.kind = 'group.dispatched'
        AND NOT EXISTS (SELECT 1 FROM group_rounds r WHERE r.run_id = d.run_id AND r.group_id = d.group_id AND r.round = (d.payload->>'round')::int)
        AND NOT EXISTS (SELECT 1 FROM decisions o WHERE o.run_id = d.run_id AND o.group_id = d.group_id AND o.seq > d.seq
                          AND o.kind IN ('group.outcome', 'group.dispatched'))
        AND NOT EXISTS (SELECT 1 FROM decisions x WHERE x.run_id = d.run_id AND x.kind = 'run.status' AND x.payload->>'status' IN ('completed', 'cancelled'))
      GROUP BY 1 ORDER BY 1`,
  );
  const hist = await q<{ s: number; n: number }>(
    "SELECT staleness AS s, count(*)::int AS n FROM staleness WHERE run_id = $1 AND staleness IS NOT NULL GROUP BY 1 ORDER BY 1",
  );
  const drops = await q<{ cuts: number; discards: number; sealed: number }>(
    `SELECT count(*) FILTER (WHERE kind = 'group.cut')::int AS cuts,
            count(*) FILTER (WHERE kind = 'group.outcome' AND payload->>'reason' LIKE 'stale:%')::int AS discards,
            count(*) FILTER (WHERE kind = 'step.sealed' AND NOT EXISTS (SELECT 1 FROM train_steps t WHERE t.run_id = $1 AND t.step = decisions.step))::int AS sealed
       FROM decisions WHERE run_id = $1`,
  );
  return {
    inflightByVersion: Object.fromEntries(inflight.map((r) => [String(r.v), r.n])),
    stalenessHistogram: Object.fromEntries(hist.map((r) => [String(r.s), r.n])),
    regenerations: drops[0]?.cuts ?? 0,
    staleDiscards: drops[0]?.discards ?? 0,
    sealedNotTrained: drops[0]?.sealed ?? 0,
    trainer: await trainerUtilization(db, runId),
  };
}
