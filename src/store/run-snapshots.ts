/**
 * Snapshots of a run's folded state (`run_snapshots`): a restarted controller
 * starts from the latest one and folds only the decisions after it.
 */

import type { Db } from "./db.ts";
import { loadDecisionsAfter } from "./decision-log.ts";
import { apply, fold, type RunState } from "../core/run-state.ts";
import { restoreRunState, snapshotRunState, SNAPSHOT_FORMAT } from "../core/run-state-snapshot.ts";

/** Decisions folded since the last snapshot before the controller writes another. */
export const SNAPSHOT_EVERY_DECISIONS = 20_000;
/** Snapshots kept per run: the newest, and one before it in case the newest is ever unreadable. */
const KEEP = 2;

/**
 * The run's state: the newest usable snapshot (of the KEEP newest), then every
 * decision after it. No usable snapshot (another format, a failed parse) means
 * a fold of the whole log, which gives the same state, only slower.
 * `fromSnapshotSeq` is the snapshot's seq (-1: none used).
 */
export async function loadRunState(db: Db, runId: string): Promise<{ state: RunState; fromSnapshotSeq: number }> {
  const snaps = await db.pool.query<{ seq: string; state: string }>(
    `SELECT seq, state FROM run_snapshots WHERE run_id = $1 AND format = $2 ORDER BY seq DESC LIMIT ${KEEP}`,
    [runId, SNAPSHOT_FORMAT],
  );
  let state: RunState | null = null;
  for (const row of snaps.rows) {
    try {
      state = restoreRunState(runId, JSON.parse(row.state));
    } catch {
      // A snapshot this build cannot restore is only a cache: an older one, or the fold of the whole decision log, gives the same state.
      state = null;
    }
    if (state !== null) break;
  }
  if (state === null) return { state: fold(runId, await loadDecisionsAfter(db, runId, -1)), fromSnapshotSeq: -1 };
  const fromSnapshotSeq = state.seq;
  for (const d of await loadDecisionsAfter(db, runId, state.seq)) apply(state, d);
  return { state, fromSnapshotSeq };
}

/**
 * Store a snapshot of `state` (already committed: every decision up to
 * `state.seq` is in the log) and drop the older ones beyond the newest KEEP.
 * Idempotent: a second snapshot at the same seq is the same state.
 */
export async function saveRunSnapshot(db: Db, state: RunState): Promise<void> {
  const json = JSON.stringify(snapshotRunState(state));
  await db.pool.query(
    `WITH ins AS (
       INSERT INTO run_snapshots (run_id, seq, format, state) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING seq
     )
     DELETE FROM run_snapshots WHERE run_id = $1 AND seq < $2
       AND seq NOT IN (SELECT seq FROM run_snapshots WHERE run_id = $1 ORDER BY seq DESC LIMIT ${KEEP - 1})`,
    [state.runId, state.seq, SNAPSHOT_FORMAT, json],
  );
}
