import type { Db } from "./db.ts";

/** A run's progress as its projections hold it: one row, cheap enough to read on every wake-up. */
export interface RunProgressRow {
  status: string;
  /** Committed train steps. */
  trainSteps: number;
  numRollout: number | null;
  weightVersion: number;
  lastError: string | null;
  /** The seq of the last decision the run's projection folded. */
  seq: number;
}

/** Null: no such run. */
export async function loadRunProgress(db: Db, runId: string): Promise<RunProgressRow | null> {
  const { rows } = await db.pool.query<{
    status: string;
    train_steps: number;
    num_rollout: number | null;
    weight_version: number;
    last_error: string | null;
    last_seq: string;
  }>(
    `SELECT status, weight_version, last_error, last_seq, (config->>'num_rollout')::int AS num_rollout,
       (SELECT count(*)::int FROM train_steps t WHERE t.run_id = r.id) AS train_steps
     FROM runs r WHERE id = $1`,
    [runId],
  );
  const r = rows[0];
  if (!r) return null;
  return {
    status: r.status,
    trainSteps: r.train_steps,
    numRollout: r.num_rollout,
    weightVersion: r.weight_version,
    lastError: r.last_error,
    seq: Number(r.last_seq),
  };
}
