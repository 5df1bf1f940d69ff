import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createDb, type Db } from "../../src/store/db.ts";
import { createTestDatabase } from "../helpers/services.ts";
import { insertRun } from "../../src/store/run-facts.ts";
import { appendDecisions, loadDecisions } from "../../src/store/decision-log.ts";
import { loadRunState, saveRunSnapshot } from "../../src/store/run-snapshots.ts";
import { fold, type RunState } from "../../src/core/run-state.ts";
import type { Decision } from "../../src/core/decisions.ts";

/**
 * A restart's state from `run_snapshots` plus the decisions after it equals the
 * fold of the whole log (store/run-snapshots.ts), against real Postgres; only
 * the two newest snapshots are kept, and a damaged one falls back to the older one, then to
 * the full fold.
 */
const plain = (s: RunState) =>
  JSON.parse(JSON.stringify(s, (_k, v: unknown) => (v instanceof Map || v instanceof Set ? { [v.constructor.name]: [...v] } : v))) as unknown;

describe("run snapshots", () => {
  let db: Db;
  let drop: () => Promise<void>;
  const runId = "snap1";
  let seq = 0;
  const decide = async (list: Decision[]) => {
    await appendDecisions(db, runId, 0, seq, list);
    seq += list.length;
  };
  const step = (s: number): Decision[] => {
    const groups = [2 * s, 2 * s + 1];
    return [
      { kind: "step.started", payload: { step: s, weightVersion: s } },
      {
        kind: "prompts.drawn",
        payload: {
          step: s,
          fromBuffer: [],
          fresh: groups.map((g) => ({ groupId: g, epoch: 0, datasetIndex: g })),
          cursor: { epoch: 0, offset: 2 * s + 2, nextOrdinal: 2 * s + 2 },
        },
      },
      ...groups.map((g): Decision => ({ kind: "group.dispatched", payload: { groupId: g, round: 0, step: s, weightVersion: s } })),
      ...groups.map((g): Decision => ({ kind: "group.outcome", payload: { groupId: g, step: s, outcome: "kept", reason: null } })),
      { kind: "step.sealed", payload: { step: s, kept: groups, aborted: [] } },
      { kind: "train.dispatched", payload: { step: s, weightVersionIn: s } },
      { kind: "step.trained", payload: { step: s, weightVersionOut: s + 1, checkpointUri: `file:///c${s}` } },
      { kind: "weights.synced", payload: { step: s, weightVersion: s + 1, checkpointUri: `file:///c${s}` } },
    ];
  };

  beforeAll(async () => {
    const database = await createTestDatabase("rlq_snapshots");
    drop = () => database.drop();
    db = createDb(database.url, { max: 4 });
    const config = {
      prompt_data: "p.jsonl",
      rm_type: "math",
      rollout_batch_size: 2,
      n_samples_per_prompt: 2,
      num_rollout: 10,
      rollout_max_response_len: 16,
      engine: { kind: "sglang", urls: ["http://127.0.0.1:1"] },
      trainer: { kind: "remote", url: "http://127.0.0.1:2" },
    };
    await insertRun(db, { runId, name: runId, config, datasetFingerprint: "x", datasetSize: 20, datasetErrors: [], pluginFingerprints: {} });
    seq = ((await db.pool.query<{ s: number }>("SELECT max(seq)::int AS s FROM decisions WHERE run_id = $1", [runId])).rows[0]?.s ?? -1) + 1;
  });
  afterAll(async () => {
    await db?.close();
    await drop?.();
  });

  it("restores the newest snapshot and folds the rest; keeps two; a damaged one falls back to the older, then to the full fold", async () => {
    expect((await loadRunState(db, runId)).fromSnapshotSeq).toBe(-1);
    const seqs: number[] = [];
    for (let s = 0; s < 4; s++) {
      await decide(step(s));
      const state = fold(runId, await loadDecisions(db, runId));
      await saveRunSnapshot(db, state);
      seqs.push(state.seq);
    }
    await decide(step(4).slice(0, 5)); // mid-step: drawn, dispatched, one outcome
    const whole = fold(runId, await loadDecisions(db, runId));

    const restored = await loadRunState(db, runId);
    expect(restored.fromSnapshotSeq).toBe(seqs[3]);
    expect(plain(restored.state)).toEqual(plain(whole));
    const kept = await db.pool.query<{ seq: string }>("SELECT seq FROM run_snapshots WHERE run_id = $1 ORDER BY seq", [runId]);
    expect(kept.rows.map((r) => Number(r.seq))).toEqual(seqs.slice(2));

    await db.pool.query('UPDATE run_snapshots SET state = \'{"format": 1, "runId": "snap1"}\' WHERE run_id = $1 AND seq = $2', [runId, seqs[3]]);
    const older = await loadRunState(db, runId);
    expect(older.fromSnapshotSeq).toBe(seqs[2]);
    expect(plain(older.state)).toEqual(plain(whole));
    await db.pool.query("UPDATE run_snapshots SET state = 'not json' WHERE run_id = $1 AND seq = $2", [runId, seqs[2]]);
    const fallback = await loadRunState(db, runId);
    expect(fallback.fromSnapshotSeq).toBe(-1);
    expect(plain(fallback.state)).toEqual(plain(whole));
  });
});
