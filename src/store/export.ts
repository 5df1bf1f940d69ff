import type { Db } from "./db.ts";

/** Stream a run's rollout history as rows, in step and group order, in pages. */
export async function* historyPages(db: Db, runId: string, pageSize = 500): AsyncGenerator<Record<string, unknown>[]> {
  let after: [number, number, number] = [-1, -1, -1];
  for (;;) {
    const { rows } = await db.pool.query(
      `SELECT * FROM rollout_history WHERE run_id = $1 AND (step, group_id, sample_index) > ($2, $3, $4)
       ORDER BY step, group_id, sample_index LIMIT $5`,
      [runId, after[0], after[1], after[2], pageSize],
    );
    if (rows.length === 0) return;
    yield rows;
    const last = rows[rows.length - 1] as { step: number; group_id: number; sample_index: number };
    after = [last.step, Number(last.group_id), last.sample_index];
  }
}
