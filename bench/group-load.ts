/**
 * Loading a train batch's groups (store/group-view.ts `loadGroupsWithRewards`,
 * which the train step, the controller and replay use): segments as JSON,
 * parsed by `JSON.parse`, against the same rows read as Postgres arrays through
 * the driver's per-element array parser (how drizzle read them before), in
 * the same run. Medians of several loads.
 *
 *   npx tsx bench/group-load.ts [--groups 256] [--samples 8] [--tokens 1000] [--reps 5]
 */
import { parseArgs } from "node:util";
import { createDb } from "../src/store/db.ts";
import { loadGroupsWithRewards } from "../src/store/group-view.ts";
import { createTestDatabase } from "../test/helpers/services.ts";
import { median, prepareServices, writeResult } from "./lib.ts";

const { values } = parseArgs({
  options: {
    groups: { type: "string", default: "256" },
    samples: { type: "string", default: "8" },
    tokens: { type: "string", default: "1000" },
    reps: { type: "string", default: "5" },
  },
});
const G = Number(values.groups);
const N = Number(values.samples);
const T = Number(values.tokens);
const reps = Number(values.reps);

await prepareServices();
const database = await createTestDatabase("rlq_bgroupload");
const db = createDb(database.url, { max: 4 });
try {
  const runId = "bench";
  const literal = (f: (i: number) => number) => `{${Array.from({ length: T }, (_, i) => f(i)).join(",")}}`;
  await db.pool.query(
    `INSERT INTO drawn_prompts (run_id, draw_ordinal, epoch, dataset_index, step, prompt, label, metadata, prompt_tokens)
     SELECT $1, g, 0, g, 0, 'p', null, '{}'::jsonb, '{1,2,3}'::int4[] FROM generate_series(0, $2::int - 1) g`,
    [runId, G],
  );
  await db.pool.query(
    `INSERT INTO sample_segments (run_id, group_id, sample_index, segment_index, round, step, job_id, weight_version, expected_weight_version,
       is_version_mismatch, token_start, token_end, tokens, log_probs, loss_mask, engine, finish_reason, status, error)
     SELECT $1, g, s, 0, 0, 0, 'j', 0, 0, false, 0, $4::int, $5::int4[], $6::float4[], $7::int2[], 'e', 'stop', 'completed', null
       FROM generate_series(0, $2::int - 1) g, generate_series(0, $3::int - 1) s`,
    [runId, G, N, T, literal((i) => (i * 7919) % 50_000), literal((i) => -((i % 97) / 13.7)), literal(() => 1)],
  );
  await db.pool.query(
    `INSERT INTO sample_rewards (run_id, group_id, sample_index, round, step, job_id, reward, components)
     SELECT $1, g, s, 0, 0, 'r', 1, '{}'::jsonb FROM generate_series(0, $2::int - 1) g, generate_series(0, $3::int - 1) s`,
    [runId, G, N],
  );
  const keys = Array.from({ length: G }, (_, groupId) => ({ groupId, round: 0, maskBeforeRound: null }));
  const time = async (f: () => Promise<unknown>): Promise<number> => {
    const t0 = performance.now();
    await f();
    return performance.now() - t0;
  };
  const json: number[] = [];
  const arrays: number[] = [];
  for (let i = 0; i < reps; i++) {
    json.push(await time(() => loadGroupsWithRewards(db, runId, keys, N)));
    arrays.push(
      await time(() =>
        db.pool.query(
          `SELECT group_id, sample_index, segment_index, round, weight_version, tokens, log_probs, loss_mask, finish_reason, status, engine
             FROM sample_segments WHERE run_id = $1 AND group_id = ANY($2::bigint[])`,
          [runId, keys.map((k) => k.groupId)],
        ),
      ),
    );
  }
  const out = {
    bench: "group-load",
    groups: G,
    samples_per_group: N,
    tokens_per_sample: T,
    reps,
    json_loader_ms: json,
    array_rows_ms: arrays,
    median_json_loader_ms: median(json),
    median_array_rows_ms: median(arrays),
    speedup: median(arrays) / median(json),
  };
  process.stderr.write(
    `groups ${G} x ${N} x ${T} tokens: loader ${median(json).toFixed(0)} ms, segments alone as array rows ${median(arrays).toFixed(0)} ms (x${out.speedup.toFixed(2)})\n`,
  );
  await writeResult("group-load", out);
} finally {
  await db.close();
  await database.drop();
}
