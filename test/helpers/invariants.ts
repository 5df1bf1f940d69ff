import { expect } from "vitest";
import type { Db } from "../../src/store/db.ts";
import { drawFresh } from "../../src/core/data-buffer.ts";

/**
 * The durability invariants every finished run must satisfy, checked in SQL
 * over its facts (used by the crash tests).
 */
export async function checkRunInvariants(
  db: Db,
  runId: string,
  opts: { numRollout: number; datasetSize: number; shuffle: boolean; seed: number; rbs: number },
): Promise<void> {
  const q = async (text: string) => (await db.pool.query(text, [runId])).rows;

  // Each step committed exactly once, 0..N-1, versions chained.
  const steps = await q("SELECT step, weight_version_in, weight_version_out FROM train_steps WHERE run_id = $1 ORDER BY step");
  expect(steps.map((s) => s.step)).toEqual([...Array(opts.numRollout).keys()]);
  for (const s of steps) expect(s.weight_version_out).toBe(s.weight_version_in + 1);

  // Draw ordinals gapless from 0, and the dataset order is the deterministic permutation.
  const draws = await q("SELECT draw_ordinal, epoch, dataset_index FROM drawn_prompts WHERE run_id = $1 ORDER BY draw_ordinal");
  const expected = drawFresh({ size: opts.datasetSize, shuffle: opts.shuffle, seed: opts.seed }, { epoch: 0, offset: 0, nextOrdinal: 0 }, draws.length).draws;
  expect(draws.map((d) => [Number(d.draw_ordinal), d.epoch, d.dataset_index])).toEqual(expected.map((d) => [d.groupId, d.epoch, d.datasetIndex]));

  // No group kept twice; every trained group belongs to exactly one committed step with rbs groups.
  expect(
    await q(
      "SELECT group_id FROM decisions WHERE run_id = $1 AND kind = 'group.outcome' AND payload->>'outcome' = 'kept' GROUP BY group_id HAVING count(*) > 1",
    ),
  ).toEqual([]);
  const perStep = await q(
    "SELECT trained_step, count(DISTINCT group_id)::int AS g FROM rollout_history WHERE run_id = $1 AND trained_step IS NOT NULL GROUP BY 1 ORDER BY 1",
  );
  expect(perStep).toEqual(steps.map((s) => ({ trained_step: s.step, g: opts.rbs })));
  expect(await q("SELECT group_id FROM rollout_history WHERE run_id = $1 GROUP BY group_id, sample_index HAVING count(*) > 1")).toEqual([]);

  // Exactly one sealed batch per step, and one filter verdict per (group, round).
  expect(await q("SELECT step FROM decisions WHERE run_id = $1 AND kind = 'step.sealed' GROUP BY step HAVING count(*) > 1")).toEqual([]);
  expect(await q("SELECT group_id, payload->>'round' FROM decisions WHERE run_id = $1 AND kind = 'group.filtered' GROUP BY 1, 2 HAVING count(*) > 1")).toEqual(
    [],
  );

  // Segments of a sample are contiguous: each resumes where the previous ended, or restarts from
  // the prompt in the round a staleness cut (group.cut) named for that sample.
  const gaps = await q(`
    SELECT group_id, sample_index, segment_index FROM (
      SELECT group_id, sample_index, segment_index, token_start, round,
        lag(token_end) OVER (PARTITION BY group_id, sample_index ORDER BY segment_index) AS prev_end,
        lag(segment_index) OVER (PARTITION BY group_id, sample_index ORDER BY segment_index) AS prev_idx
      FROM sample_segments WHERE run_id = $1) s
    WHERE (prev_end IS NULL AND (token_start <> 0 OR segment_index <> 0))
      OR (prev_end IS NOT NULL AND (segment_index <> prev_idx + 1 OR (token_start <> prev_end AND NOT (token_start = 0 AND EXISTS (
        SELECT 1 FROM decisions c WHERE c.run_id = $1 AND c.kind = 'group.cut' AND c.group_id = s.group_id
          AND (c.payload->>'round')::int = s.round AND c.payload->'samples' @> to_jsonb(s.sample_index))))))`);
  expect(gaps).toEqual([]);

  // Every buffered group was later resumed (dispatched again) or is still in the buffer at the end;
  // none vanished: each drawn group has a final outcome, or its last outcome is 'buffered'.
  const lost = await q(`
    SELECT d.draw_ordinal FROM drawn_prompts d
    LEFT JOIN LATERAL (SELECT payload->>'outcome' AS o FROM decisions x WHERE x.run_id = d.run_id AND x.group_id = d.draw_ordinal AND x.kind = 'group.outcome' ORDER BY seq DESC LIMIT 1) o ON true
    WHERE d.run_id = $1 AND o.o IS NULL
      AND NOT EXISTS (SELECT 1 FROM decisions x WHERE x.run_id = d.run_id AND x.kind = 'step.sealed' AND x.step = (SELECT max(step) FROM train_steps WHERE run_id = $1))`);
  expect(lost).toEqual([]);
}
